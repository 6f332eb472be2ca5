"""The costs that decide MRP's speed on a deployment-shaped model, on a GPU; prints one JSON document.

A random-weight model with the shape of SDAR-1.7B (a Qwen3 decoder: hidden 2048, 28 layers, 16 query / 8 key-value
heads of 128, MLP 6144, vocabulary 151936, block-causal with blocks of 4; the repository's SDAR stand-in code,
tests/stand_ins/sdar) and a random 3-layer MRP head of the backbone's width (the reference's proportion), both in
bfloat16. For batch 1 and batch 16 (random prompts of `--prompt-len` tokens, `--new-tokens` decoded):
- verify forward (K+1 candidate states, packed and stacked) / plain forward of one block;
- head draft step (head forward + lm_head + pick, by speculative decoding's own draft loop) / backbone forward;
- the engine's overhead per backbone forward (generate time outside the backbone and head forwards), static
  and speculative;
all with `bench_cost_ratio.py`'s code. Random weights change no timing. `--device cpu` is a dry run of the same
code on tiny shapes (the test suite runs it).

    python benchmarks/gpu_check.py --device cuda > gpu_check.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import bench_cost_ratio  # noqa: E402

#: SDAR-1.7B-Chat's shape (Qwen3-1.7B): what the Hub config.json says
SDAR_1_7B = dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                 rope_theta=1000000.0, tie_word_embeddings=True, block_size=4, mask_token_id=151669)
#: the dry run's shape (CPU, seconds)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=512, max_position_embeddings=1024, rope_theta=10000.0, tie_word_embeddings=True,
            block_size=4, mask_token_id=500)


def sdar_shaped(shape: dict, device: torch.device, dtype: torch.dtype, head_layers: int):
    """MRPModel of a random SDAR-shaped backbone and a random head, built on `device` in `dtype`."""
    from stand_ins.sdar.configuration_sdar import SDARConfig
    from stand_ins.sdar.modeling_sdar import SDARForCausalLM

    import mrp_hf

    torch.manual_seed(0)
    config = SDARConfig(**shape, eos_token_id=shape["vocab_size"] - 2, pad_token_id=shape["vocab_size"] - 2)
    with torch.device(device):
        backbone = SDARForCausalLM(config).to(dtype).eval()
    model = mrp_hf.MRPModel.from_backbone(backbone, mask_token_id=shape["mask_token_id"])
    head_config = mrp_hf.MRPConfig.for_backbone(model.adapter, num_hidden_layers=head_layers)
    with torch.device(device):
        head = mrp_hf.MRPHead(head_config).to(dtype).eval()
    with torch.no_grad():  # a random, non-zero head output (an untrained head outputs exactly 0)
        if head.out_proj is not None:
            head.out_proj.weight.normal_(std=0.02)
        else:
            head.norm.weight.fill_(1.0)
    return mrp_hf.MRPModel.from_backbone(backbone, head=head, mask_token_id=shape["mask_token_id"])


def measure(model, batch: int, prompt_len: int, new_tokens: int, draft_tokens: int, repeats: int, device) -> dict:
    shape_vocab = model.adapter.get_input_embeddings().weight.shape[0]
    ids = torch.randint(0, shape_vocab - 200, (batch, prompt_len), generator=torch.Generator().manual_seed(batch))
    ids, mask = ids.to(device), torch.ones(batch, prompt_len, dtype=torch.long, device=device)
    clock = bench_cost_ratio.Clock(device)
    block = model.backbone.config.block_size
    costs = bench_cost_ratio.forward_costs(model.adapter, model.head, ids, mask, block, new_tokens, draft_tokens,
                                           repeats, clock)
    engine = bench_cost_ratio.engine_overhead(
        model, ids, mask, {"max_new_tokens": new_tokens, "block_length": block, "eos_token_id": None}, 3, clock)
    return {"batch": batch, **costs, "engine": engine}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--draft-tokens", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--head-layers", type=int, default=3)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dry_run = device.type == "cpu"
    shape, dtype = (TINY, torch.float32) if dry_run else (SDAR_1_7B, torch.bfloat16)
    started = time.perf_counter()
    model = sdar_shaped(shape, device, dtype, args.head_layers)
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run, tiny shapes)",
        "torch": torch.__version__, "model": "random SDAR-1.7B-shaped" if not dry_run else "random tiny SDAR-shaped",
        "shape": shape, "dtype": str(dtype), "head_layers": args.head_layers, "draft_tokens": args.draft_tokens,
        "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
        "runs": [measure(model, int(b), args.prompt_len, args.new_tokens, args.draft_tokens, args.repeats, device)
                 for b in args.batches.split(",")],
    }
    result["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
