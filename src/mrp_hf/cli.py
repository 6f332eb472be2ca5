"""`mrp-hf`: command-line entry point.

Subcommands today: `families`, `generate` (decode prompts with any supported backbone) and `train` (train an
MRP head on a frozen backbone, see docs/training.md). `demo`, `bench`, `eval` and `push` arrive later.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from . import __version__


def _cmd_families(args: argparse.Namespace) -> int:
    from .backbones.registry import _ADAPTERS, _REFUSED

    rows = []
    for family, cls in sorted(_ADAPTERS.items()):
        rows.append(
            {
                "family": family,
                "model_types": list(cls.model_types),
                "architectures": list(cls.architectures),
                "attention": "block_causal" if cls.block_causal else "bidirectional",
                "shifted_logits": cls.shifted_logits,
                "padding": cls.supports_padding,
                "mask_token_id": cls.default_mask_token_id,
            }
        )
    if args.json:
        print(json.dumps({"supported": rows, "refused": _REFUSED}, indent=2))
        return 0
    print(f"{'family':<14}{'attention':<15}{'shifted':<9}{'padding':<9}{'mask id':<9}model_type / architectures")
    for r in rows:
        names = ", ".join(r["model_types"] + r["architectures"]) or "(any model with a mask token id)"
        print(
            f"{r['family']:<14}{r['attention']:<15}{str(r['shifted_logits']):<9}{str(r['padding']):<9}"
            f"{str(r['mask_token_id'] or '-'):<9}{names}"
        )
    for name, reason in _REFUSED.items():
        print(f"refused: {name}: {reason}")
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoTokenizer

    from .modeling_mrp import MRPModel

    dtype = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    model = MRPModel.from_backbone_pretrained(
        args.backbone,
        backbone_family=args.backbone_family,
        mask_token_id=args.mask_token_id,
        trust_remote_code=args.trust_remote_code,
        revision=args.revision,
        torch_dtype=dtype,
        device_map=args.device_map,
    )
    tokenizer = AutoTokenizer.from_pretrained(args.backbone, revision=args.revision, trust_remote_code=args.trust_remote_code)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    prompts = list(args.prompt)
    if args.prompts_file:
        with open(args.prompts_file, encoding="utf-8") as handle:
            prompts += [line.rstrip("\n") for line in handle if line.strip()]
    if not prompts:
        print("mrp-hf generate: give --prompt TEXT (repeatable) or --prompts-file PATH", file=sys.stderr)
        return 2
    if args.chat:
        prompts = [
            tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
            for p in prompts
        ]
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=not args.chat)
    start = time.perf_counter()
    out = model.generate(
        batch["input_ids"],
        attention_mask=batch["attention_mask"],
        max_new_tokens=args.max_new_tokens,
        block_length=args.block_length,
        threshold=args.threshold,
        temperature=args.temperature,
        seed=args.seed,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        return_dict_in_generate=True,
    )
    seconds = time.perf_counter() - start
    answers = tokenizer.batch_decode(out.sequences[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    for prompt, answer in zip(prompts, answers, strict=True):
        print(json.dumps({"prompt": prompt, "answer": answer}, ensure_ascii=False) if args.json else f"{answer}")
    stats = out.stats.to_dict()
    stats["wall_seconds"] = round(seconds, 3)
    print(json.dumps(stats), file=sys.stderr)
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from .train import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mrp-hf", description="Multi-token Residual Prediction for diffusion LMs.")
    parser.add_argument("--version", action="version", version=f"mrp-hf {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    fam = sub.add_parser("families", help="list the supported DLM families and how the engine sees them")
    fam.add_argument("--json", action="store_true")
    fam.set_defaults(func=_cmd_families)

    gen = sub.add_parser("generate", help="decode prompts with a DLM backbone (static or dynamic decoding)")
    gen.add_argument("--backbone", required=True, help="Hub id or local folder of the DLM")
    gen.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for a batch)")
    gen.add_argument("--prompts-file", help="a text file with one prompt per line")
    gen.add_argument("--chat", action="store_true", help="wrap prompts with the tokenizer's chat template")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--block-length", type=int, default=None)
    gen.add_argument("--threshold", type=float, default=None, help="dynamic decoding threshold (default: static)")
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--backbone-family", default=None)
    gen.add_argument("--mask-token-id", type=int, default=None)
    gen.add_argument("--trust-remote-code", action="store_true")
    gen.add_argument("--revision", default=None)
    gen.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto")
    gen.add_argument("--device-map", default=None, help='e.g. "auto" or "cuda:0"')
    gen.add_argument("--json", action="store_true", help="one JSON object per answer")
    gen.set_defaults(func=_cmd_generate)

    from .train import add_train_arguments

    train = sub.add_parser("train", help="train an MRP head on a frozen DLM backbone (see docs/training.md)")
    add_train_arguments(train)
    train.set_defaults(func=_cmd_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
