"""Head-training step time against one backbone forward on the same batch, side by side in one run.

A training step (exactly what `mrp_hf.training.train_head` runs per optimizer step with grad_accum=1): two
frozen backbone forwards (x_t -> h_A, A; x' -> T; K + 1 with --k-steps K), the head forward and backward
through the frozen lm_head, gradient clipping, AdamW and the LR schedule, all through `accelerate`. The
reference is one no-grad backbone forward of the same batch (what one decoding step costs). The two are
timed alternately so that a busy machine slows both alike; the medians are compared.

    python benchmarks/bench_training.py                       # a stand-in shaped like a small DLM, on CPU
    python benchmarks/bench_training.py --layers 28 --head-layers 3 --hidden 512 --vocab 32768

The backbone is the SDAR (or --family) stand-in from tests/stand_ins with random weights: only shapes
matter for time. Target: ratio <= 3.5.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def build_backbone(args, folder: Path):
    from stand_ins import save_stand_in

    import mrp_hf

    sizes = {
        "sdar": dict(hidden_size=args.hidden, intermediate_size=3 * args.hidden, num_hidden_layers=args.layers,
                     num_attention_heads=args.hidden // 64, num_key_value_heads=max(1, args.hidden // 128), head_dim=64),
        "llada": dict(d_model=args.hidden, mlp_hidden_size=3 * args.hidden, n_layers=args.layers,
                      n_heads=args.hidden // 64, n_kv_heads=args.hidden // 64, embedding_size=args.vocab),
    }[args.family]
    path = save_stand_in(
        args.family, folder / args.family, with_tokenizer=False, vocab_size=args.vocab, max_position_embeddings=4 * args.seq,
        max_sequence_length=4 * args.seq, mask_token_id=args.vocab - 2, **sizes,
    )
    model = mrp_hf.load_backbone(str(path), trust_remote_code=True)
    return model, mrp_hf.get_adapter(model, mask_token_id=args.vocab - 2)


def make_batch(args, generator: torch.Generator):
    from mrp_hf.training import RowBuilder, RowCollator, Sample

    prompt = args.seq // 4
    samples = [
        Sample(torch.randint(0, args.vocab - 3, (prompt,), generator=generator).tolist(),
               torch.randint(0, args.vocab - 3, (args.seq - prompt,), generator=generator).tolist())
        for _ in range(args.batch)
    ]
    rows, _ = RowBuilder(args.seq + args.block, args.vocab - 3, align=args.block).build(samples)
    return RowCollator(args.vocab - 3, args.block, absolute_blocks=args.family != "llada")(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", choices=["sdar", "llada"], default="sdar")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=12, help="backbone layers")
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--head-layers", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--k-steps", type=int, default=1)
    parser.add_argument("--objective", choices=["kl", "ce"], default="kl")
    parser.add_argument("--mixed-precision", choices=["no", "bf16", "fp16"], default="no")
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None, help="also write the result to this file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from accelerate import Accelerator

    from mrp_hf import MRPConfig, MRPHead
    from mrp_hf.training import HeadChain, MRPObjective
    from mrp_hf.training.trainer import _adamw  # the trainer's optimizer (fused AdamW where available)

    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    with tempfile.TemporaryDirectory() as tmp:
        model, adapter = build_backbone(args, Path(tmp))
    model.to(accelerator.device).eval().requires_grad_(False)
    grid = args.block if adapter.block_causal else None
    objective = MRPObjective(adapter, block_length=args.block, grid=grid, objective=args.objective, k_steps=args.k_steps)
    torch.manual_seed(0)
    head = MRPHead(MRPConfig.for_backbone(adapter, num_hidden_layers=args.head_layers))
    torch.nn.init.ones_(head.norm.weight)  # a trained-like head: gradients reach every layer
    chain = HeadChain(head)
    optimizer = _adamw(list(head.parameters()), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    chain, optimizer, scheduler = accelerator.prepare(chain, optimizer, scheduler)
    generator = torch.Generator().manual_seed(0)
    batch = {k: v.to(accelerator.device) for k, v in make_batch(args, generator).items()}

    def sync():
        if accelerator.device.type == "cuda":
            torch.cuda.synchronize()

    def backbone_forward() -> float:
        sync()
        start = time.perf_counter()
        with torch.no_grad(), accelerator.autocast():
            adapter.forward(batch["input_ids"], batch["attention_mask"], batch["position_ids"], grid=grid)
        sync()
        return time.perf_counter() - start

    def train_step() -> float:
        sync()
        start = time.perf_counter()
        with accelerator.autocast():
            prepared = objective.prepare(batch, generator)
            loss = objective.loss(chain, prepared)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(chain.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        sync()
        return time.perf_counter() - start

    for _ in range(args.warmup):
        backbone_forward()
        train_step()
    forward_times, step_times = [], []
    for _ in range(args.iters):
        forward_times.append(backbone_forward())
        step_times.append(train_step())
    forward, step = statistics.median(forward_times), statistics.median(step_times)
    params = {
        "backbone": sum(p.numel() for p in model.parameters()),
        "head": sum(p.numel() for p in head.parameters()),
    }
    result = {
        "command": "python benchmarks/bench_training.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
        "device": str(accelerator.device),
        "threads": torch.get_num_threads(),
        "shape": {"batch": args.batch, "seq": batch["input_ids"].shape[1], "hidden": args.hidden, "layers": args.layers,
                  "vocab": args.vocab, "head_layers": args.head_layers, "k_steps": args.k_steps},
        "parameters": params,
        "backbone_forward_ms": round(1e3 * forward, 2),
        "train_step_ms": round(1e3 * step, 2),
        "ratio": round(step / forward, 3),
        "target": 3.5,
    }
    print(result["command"])
    print(
        f"backbone {params['backbone'] / 1e6:.1f}M params x{args.layers} layers, head {params['head'] / 1e6:.1f}M x{args.head_layers}; "
        f"batch {args.batch} x {result['shape']['seq']} tokens on {result['device']} ({result['threads']} threads)"
    )
    print(f"one backbone forward: {result['backbone_forward_ms']:.1f} ms (median of {args.iters})")
    print(f"one training step:    {result['train_step_ms']:.1f} ms (2 frozen forwards + head fwd/bwd + AdamW)"
          if args.k_steps == 1 else f"one training step:    {result['train_step_ms']:.1f} ms ({args.k_steps + 1} frozen forwards)")
    print(f"ratio: {result['ratio']:.2f}x (target <= {result['target']})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
