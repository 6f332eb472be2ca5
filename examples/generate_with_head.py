"""Decode with a Hub backbone and an MRP head: `MRPModel.from_pretrained(head)` loads the head (safetensors and
config only) and the backbone its config names, then `generate(..., mrp_mode=...)` uses the head.

    # a head trained with examples/train_head_jsonl.py (its config names JetLM/SDAR-1.7B-Chat)
    python examples/generate_with_head.py --head heads/sdar-1.7b-chat-mrp --trust-remote-code
    python examples/generate_with_head.py --head HEAD --mode remask --threshold 0.5 --trust-remote-code
    python examples/generate_with_head.py --tiny          # the bundled reference model, CPU, seconds (see _tiny.py)

The decoding is run twice: once as the backbone's own static decoding (`mrp_mode="off"`, one token per
backbone forward), once in the chosen MRP mode. The speculative mode must give exactly the same tokens.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from transformers import AutoTokenizer

import mrp_hf


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head", default="heads/sdar-1.7b-chat-mrp", help="MRP head folder or Hub id")
    parser.add_argument("--backbone", default=None, help="default: the base model named in the head's config")
    parser.add_argument("--prompt", default="Write a Python function that returns the n-th Fibonacci number.")
    parser.add_argument("--mode", choices=["speculative", "remask", "direct"], default="speculative")
    parser.add_argument("--draft-tokens", type=int, default=3, help="speculative / direct: K head steps per round")
    parser.add_argument("--threshold", type=float, default=0.5, help="remask: the dynamic-decoding threshold")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="0: the model's generation_config.json")
    parser.add_argument("--trust-remote-code", action="store_true", help="run the model repo's own Python code")
    parser.add_argument("--tiny", action="store_true", help="the bundled reference model (or MRP_EXAMPLES_TINY=1)")
    args = parser.parse_args()
    if args.tiny or os.environ.get("MRP_EXAMPLES_TINY", "") not in ("", "0"):
        from _tiny import tiny_paths, tiny_prompts  # examples/_tiny.py: only the tiny path needs it

        backbone, args.head = tiny_paths()
        args.backbone = args.backbone or backbone
        args.prompt, args.max_new_tokens = tiny_prompts(1)[0], 0  # the reference model's own answer length
    return args


def main() -> int:
    args = parse_args()
    gpu = torch.cuda.is_available()
    load = {"trust_remote_code": args.trust_remote_code}
    if gpu:  # bf16 weights spread over the visible GPUs; on a CPU keep float32
        load.update(torch_dtype=torch.bfloat16, device_map="auto")

    # 1. The head, and its backbone: loaded from the id in the head's config (at the recorded revision, plus a
    #    PEFT adapter if it names one), or the one given here. Either way the backbone is checked against the
    #    head (vocab, hidden size, mask id, family, weight fingerprint) and a mismatch raises ValueError.
    backbone = mrp_hf.load_backbone(args.backbone, **load) if args.backbone else None
    model = mrp_hf.MRPModel.from_pretrained(args.head, backbone=backbone, **({} if backbone is not None else load))
    tokenizer_source = args.backbone or model.head.config.base_model_name_or_path
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source, trust_remote_code=args.trust_remote_code)
    tokenizer.padding_side = "left"  # diffusion decoding appends the answer after the prompt

    # 2. The prompt, in the chat format the backbone was tuned on (when its tokenizer has one).
    chat = bool(getattr(tokenizer, "chat_template", None))
    text = (
        tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True, tokenize=False)
        if chat
        else args.prompt
    )
    batch = tokenizer([text], return_tensors="pt", add_special_tokens=not chat)

    # 3. Decode. A head only works with the block length it was trained with (recorded in its config), and
    #    max_new_tokens must be a multiple of the block length.
    block = model.head.config.block_length or 32
    common = dict(
        attention_mask=batch["attention_mask"], block_length=block,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, return_dict_in_generate=True,
    )
    if args.max_new_tokens:  # else the model's generation_config.json says
        common["max_new_tokens"] = -(-args.max_new_tokens // block) * block
    mode_kwargs = {"mrp_mode": args.mode}
    if args.mode in ("speculative", "direct"):
        mode_kwargs["mrp_draft_tokens"] = args.draft_tokens
    else:
        mode_kwargs["threshold"] = args.threshold

    results = {}
    for label, kwargs in (("static", {"mrp_mode": "off"}), (args.mode, mode_kwargs)):
        start = time.perf_counter()
        out = model.generate(batch["input_ids"], **common, **kwargs)
        seconds = time.perf_counter() - start
        results[label] = out
        answer = tokenizer.decode(out.sequences[0, batch["input_ids"].shape[1] :], skip_special_tokens=True)
        stats = out.stats
        print(f"--- {label}: {answer!r}")
        print(
            f"stats {label}: backbone_forwards={stats.backbone_forwards} head_forwards={stats.head_forwards} "
            f"tokens/forward={stats.mean_tokens_per_forward:.2f} accepted_drafts={stats.accepted_drafts} "
            f"revoked_reveals={stats.revoked_reveals} seconds={seconds:.2f}"
        )

    # 4. Speculative decoding is lossless: the tokens are the backbone's static decoding, token for token.
    same = torch.equal(results["static"].sequences, results[args.mode].sequences)
    print(f"identical to static: {same}")
    if args.mode == "speculative" and not same:
        raise SystemExit("speculative decoding differed from static decoding: please report this as a bug")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
