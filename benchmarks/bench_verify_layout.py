"""Speculative verify forward: candidate states stacked in the batch vs packed in one sequence, per family.

For each family that can pack (its forward takes an explicit 4-D attention pattern and position ids), two
figures, each the median of interleaved repeats:
- `verify`: the verify forward alone. Per block of a real decode: a seed forward, then K+1 candidate states
  of the block (random reveals), verified in both layouts from the same cache, `--repeats` times each;
- `generate`: end-to-end `mrp_mode="speculative"` decoding with `verify_layout` stacked vs packed (same
  tokens and forward counts: only the verify forward's cost differs).
`ratio` = stacked seconds / packed seconds (> 1: packed is faster). Times are the process's CPU seconds
(`time.process_time`; run with OMP_NUM_THREADS=1), which a busy shared machine disturbs far less than
wall-clock; on an idle machine with one thread the two agree.

Models: the tiny random stand-ins of the remote-code families (widened like bench_modes.py) and the reference
DLM: the bundled trained checkpoint with its head when `src/mrp_hf/reference/checkpoints/backbone` exists,
else an untrained one of the same shape. Random weights do not change the timing.

    OMP_NUM_THREADS=1 python benchmarks/bench_verify_layout.py [--batch 8] [--prompt-len 96] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from stand_ins import load_stand_in  # noqa: E402

import mrp_hf  # noqa: E402
from mrp_hf.generation.config import MRPGenerationConfig  # noqa: E402
from mrp_hf.generation.engine import DecodingEngine  # noqa: E402
from mrp_hf.generation.strategies import BlockDecoder  # noqa: E402

STAND_IN_MASK_ID = 126
#: CPU seconds of this process: on a shared machine wall-clock mostly measures the neighbours
clock = time.process_time
STAND_IN_SIZE = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4)
#: (label, stand-in family or "reference", prefix_cache)
CASES = [
    ("sdar (exact cache)", "sdar", None),
    ("llada2 (no cache)", "llada2", None),
    ("dream (no cache)", "dream", None),
    ("dream (approx. cache)", "dream", True),
    ("reference DLM (exact cache)", "reference", None),
]


class VerifyTimer(BlockDecoder):
    """Per block: seed forward, then the same verify forward in both layouts (interleaved), then fill the
    block with the seed's argmax. The verify forward leaves the cache as it found it, so repeats are fair."""

    def __init__(self, copies: int, repeats: int):
        self.copies, self.repeats = copies, repeats
        self.seconds = {"stacked": [], "packed": []}

    def decode_block(self, block):
        seed = block.forward(hidden=True)
        copies = self.copies
        generator = torch.Generator().manual_seed(block.start)
        candidates = block.ids().unsqueeze(1).repeat(1, copies, 1)
        reveal = torch.rand(candidates.shape, generator=generator) < torch.arange(copies)[None, :, None] / copies
        candidates = torch.where(reveal & (candidates == block.mask_id), 3, candidates)
        for _ in range(self.repeats):
            for layout in ("stacked", "packed"):
                t0 = clock()
                block.forward(hidden=True, candidates=candidates, layout=layout)
                self.seconds[layout].append(clock() - t0)
        masked = block.masked()
        block.commit(torch.where(masked, seed.logits.argmax(-1), block.ids()), masked.sum(dim=1))


def reference_model(batch: int):
    """The bundled trained reference DLM with its head and `batch` held-out task prompts, else an untrained one
    of the same shape with random prompts. Returns (backbone, head or None, ids, mask, block length, note)."""
    from mrp_hf.reference import ReferenceDLM, ReferenceDLMConfig, held_out_items
    from mrp_hf.reference.tasks import ANSWER_LENGTH

    bundled = Path(mrp_hf.__file__).parent / "reference" / "checkpoints"
    if (bundled / "backbone" / "config.json").is_file():
        from transformers import AutoTokenizer

        backbone = mrp_hf.load_backbone(str(bundled / "backbone")).eval()
        head = mrp_hf.MRPHead.from_pretrained(str(bundled / "head")).eval() if (bundled / "head").is_dir() else None
        tokenizer = AutoTokenizer.from_pretrained(str(bundled / "backbone"))
        tokenizer.padding_side = "left"
        prompts = [item.prompt for item in held_out_items(per_task=batch)][::4][:batch]
        encoded = tokenizer(prompts, return_tensors="pt", padding=True)
        ids, mask = encoded["input_ids"], encoded["attention_mask"]
        note = "bundled trained checkpoint + head, held-out task prompts"
    else:
        torch.manual_seed(0)
        from mrp_hf.reference.train import MODEL_DEFAULTS

        config = ReferenceDLMConfig(vocab_size=46, max_position_embeddings=40, **MODEL_DEFAULTS)
        backbone, head = ReferenceDLM(config).eval(), None
        ids = torch.randint(3, 44, (batch, 16), generator=torch.Generator().manual_seed(0))
        mask = torch.ones_like(ids)
        note = "untrained, the bundled model's shape, random prompts (no bundled checkpoint)"
    return backbone, head, ids, mask, ANSWER_LENGTH, note


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def run_case(label, family, prefix_cache, args, tmp):
    if family == "reference":  # its positions stop at 40: three blocks of 8 after a prompt of at most 16
        backbone, head, prompts, mask, new_tokens, note = reference_model(args.batch)
        mask_id, block_length = None, backbone.config.block_size
    else:
        backbone = load_stand_in(family, tmp, **STAND_IN_SIZE)
        head, mask_id, note = None, STAND_IN_MASK_ID, "tiny random stand-in"
        block_length, new_tokens = args.block_length, args.max_new_tokens
        prompts = torch.randint(0, 120, (args.batch, args.prompt_len), generator=torch.Generator().manual_seed(0))
        mask = torch.ones_like(prompts)
    adapter = mrp_hf.get_adapter(backbone, mask_token_id=mask_id)
    if head is None:
        head = mrp_hf.MRPHead(mrp_hf.MRPConfig.for_backbone(adapter, num_hidden_layers=1)).eval()
    common = dict(max_new_tokens=new_tokens, block_length=block_length, prefix_cache=prefix_cache)

    # verify forward alone
    timer = VerifyTimer(copies=args.draft_tokens + 1, repeats=args.repeats)
    config = MRPGenerationConfig(**common)
    DecodingEngine(adapter, config, block_decoder=timer).run(prompts, mask)
    verify = {layout: median(s) for layout, s in timer.seconds.items()}

    # end to end
    model = mrp_hf.MRPModel.from_backbone(backbone, head=head, mask_token_id=mask_id)
    kwargs = dict(attention_mask=mask, mrp_mode="speculative", mrp_draft_tokens=args.draft_tokens,
                  return_dict_in_generate=True, **common)
    model.generate(prompts[:2], **{**kwargs, "attention_mask": mask[:2]})  # warm-up
    wall, outs = {"stacked": [], "packed": []}, {}
    for _ in range(args.generate_repeats):
        for layout in ("stacked", "packed"):
            t0 = clock()
            outs[layout] = model.generate(prompts, verify_layout=layout, **kwargs)
            wall[layout].append(clock() - t0)
    same = torch.equal(outs["stacked"].sequences, outs["packed"].sequences)
    generate = {layout: median(s) for layout, s in wall.items()}
    engine = DecodingEngine(adapter, MRPGenerationConfig(**common, mrp_mode="speculative"))
    return {
        "case": label,
        "family": adapter.family,
        "model": note,
        "prompt_len": prompts.shape[1],
        "block_length": block_length,
        "max_new_tokens": new_tokens,
        "verify_ms": {k: round(v * 1e3, 3) for k, v in verify.items()},
        "verify_ratio": round(verify["stacked"] / verify["packed"], 3),
        "generate_s": {k: round(v, 3) for k, v in generate.items()},
        "generate_ratio": round(generate["stacked"] / generate["packed"], 3),
        "identical_tokens": same,
        "backbone_forwards": outs["packed"].stats.backbone_forwards,
        "accepted_drafts": outs["packed"].stats.accepted_drafts,
        "auto_layout": engine.verify_layout(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=96)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--block-length", type=int, default=4)
    parser.add_argument("--draft-tokens", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5, help="verify forwards per layout and block")
    parser.add_argument("--generate-repeats", type=int, default=3)
    parser.add_argument("--only", help="comma-separated case families (sdar,llada2,dream,reference)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    print(f"torch threads {torch.get_num_threads()}; batch {args.batch}, K={args.draft_tokens} "
          f"({args.draft_tokens + 1} candidate states); stand-ins: block_length {args.block_length}, "
          f"max_new_tokens {args.max_new_tokens}; reference DLM: three blocks of 8")
    print(f"{'case':<30}{'prompt':>7}{'verify stacked ms':>19}{'packed ms':>11}{'ratio':>7}"
          f"{'gen stacked s':>15}{'packed s':>10}{'ratio':>7}{'same':>6}{'auto':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for label, family, prefix_cache in CASES:
            if args.only and family not in args.only.split(","):
                continue
            r = run_case(label, family, prefix_cache, args, tmp)
            rows.append(r)
            print(f"{r['case']:<30}{r['prompt_len']:>7}{r['verify_ms']['stacked']:>19}{r['verify_ms']['packed']:>11}"
                  f"{r['verify_ratio']:>7}{r['generate_s']['stacked']:>15}{r['generate_s']['packed']:>10}"
                  f"{r['generate_ratio']:>7}{str(r['identical_tokens']):>6}{r['auto_layout']:>9}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
