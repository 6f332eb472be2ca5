"""The costs that decide whether MRP pays off, measured with the engine's own calls, as ratios to one backbone
forward of the same run.

Per decoding block of a real decode (the engine's `BlockContext`, prefix cache and layout), interleaved:
- `backbone`: one plain backbone forward of the block (what static and dynamic decoding do per step);
- `verify`: one speculative verify forward of K+1 candidate states of the block, `packed` in one sequence per
  row and `stacked` in the batch (generation/packed.py);
- `head_step`: one head draft step, by speculative decoding's own draft loop (`SpeculativeDecoder._draft`, K steps
  back to back, the time divided by K): the head forward on the hidden-state accumulator, the vocabulary
  projection (the backbone's lm_head) and the pick (proposal + most confident position). The target of issue
  15 is head_step / backbone <= 0.1 (batch 1, one thread).
Then end to end, with timing hooks on the backbone and the head: `engine overhead per step` = (wall-clock of
`generate` - time inside backbone and head forwards) / backbone forwards, for static and speculative decoding.

Times: medians over repeats; on CPU the process's CPU seconds (`time.process_time`, run with one thread: a busy
shared machine disturbs them far less than wall-clock), on CUDA wall-clock with synchronisation.

    OMP_NUM_THREADS=1 python benchmarks/bench_cost_ratio.py                  # the bundled reference DLM + head
    python benchmarks/bench_cost_ratio.py --batch 16 --json rows.json
    (benchmarks/gpu_check.py uses `measure_costs` on a random SDAR-1.7B-shaped model)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from mrp_hf.generation.config import MRPGenerationConfig
from mrp_hf.generation.engine import DecodingEngine
from mrp_hf.generation.strategies import BlockDecoder
from mrp_hf.generation.strategies.speculative import SpeculativeDecoder


class Clock:
    """CPU seconds of this process on CPU; wall-clock after a device synchronisation on CUDA."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            return time.perf_counter()
        return time.process_time()


class CostTimer(BlockDecoder):
    """Per block: a seed forward, then `repeats` rounds of (plain forward, verify forward in both layouts, head
    draft step), interleaved; then the block is filled with the seed's argmax. No call changes the cache for the
    next one (the engine crops it back to the block start), so the repeats are fair."""

    def __init__(self, head, draft_tokens: int, repeats: int, clock: Clock):
        self.drafter = SpeculativeDecoder(head, draft_tokens)  # its own draft loop is what is timed
        self.copies, self.repeats, self.clock = draft_tokens + 1, repeats, clock
        self.seconds: dict[str, list[float]] = {"backbone": [], "verify_packed": [], "verify_stacked": [], "head_step": []}

    def _timed(self, name: str, call):
        start = self.clock()
        out = call()
        self.seconds[name].append(self.clock() - start)
        return out

    @torch.no_grad()
    def decode_block(self, block) -> None:
        seed = block.forward(hidden=True)
        ids, masked = block.ids(), block.masked()
        generator = torch.Generator().manual_seed(block.start)
        candidates = ids.unsqueeze(1).repeat(1, self.copies, 1)
        reveal = torch.rand(candidates.shape, generator=generator) < torch.arange(self.copies)[None, :, None] / self.copies
        filler = seed.logits.argmax(-1).unsqueeze(1).expand_as(candidates)
        candidates = torch.where(reveal.to(ids.device) & (candidates == block.mask_id), filler, candidates)
        for _ in range(self.repeats):
            self._timed("backbone", lambda: block.forward(hidden=True))
            for layout in ("packed", "stacked"):
                self._timed(f"verify_{layout}", lambda layout=layout: block.forward(hidden=True, candidates=candidates,
                                                                                 layout=layout))
            start = self.clock()  # K draft steps back to back, as a speculative round runs them after its verify
            self.drafter._draft(block, ids, masked, block.committed, seed.lm_head_input, self.copies - 1)
            self.seconds["head_step"].append((self.clock() - start) / (self.copies - 1))
        block.commit(torch.where(masked, seed.logits.argmax(-1), ids), masked.sum(dim=1))


def _median_ms(xs: list[float]) -> float:
    return round(1e3 * statistics.median(xs), 4) if xs else float("nan")


def forward_costs(adapter, head, ids, mask, block_length: int, new_tokens: int, draft_tokens: int, repeats: int,
                  clock: Clock) -> dict[str, Any]:
    """Medians (ms) of the plain forward, the verify forward (both layouts) and the head draft step, and their
    ratios to the plain forward."""
    timer = CostTimer(head, draft_tokens, repeats, clock)
    config = MRPGenerationConfig(max_new_tokens=new_tokens, block_length=block_length, eos_token_id=None)
    DecodingEngine(adapter, config, block_decoder=timer).run(ids, mask)
    ms = {name: _median_ms(values) for name, values in timer.seconds.items()}
    base = ms["backbone"]
    return {
        "ms": ms,
        "verify_packed_over_backbone": round(ms["verify_packed"] / base, 3),
        "verify_stacked_over_backbone": round(ms["verify_stacked"] / base, 3),
        "head_step_over_backbone": round(ms["head_step"] / base, 4),
    }


def _hook_seconds(modules, clock: Clock) -> tuple[dict[str, float], list[Any]]:
    """Forward hooks that add the time spent inside each module's forward to `total["seconds"]`."""
    total = {"seconds": 0.0, "calls": 0}
    handles = []
    for module in modules:
        started: list[float] = []
        handles.append(module.register_forward_pre_hook(lambda *_, s=started: s.append(clock())))

        def done(*_, s=started):
            total["seconds"] += clock() - s.pop()
            total["calls"] += 1

        handles.append(module.register_forward_hook(done))
    return total, handles


def engine_overhead(model, ids, mask, generate_kwargs: dict[str, Any], repeats: int, clock: Clock) -> dict[str, Any]:
    """Per mode (static, speculative): the engine's own time per backbone forward = (generate time - time inside
    the backbone and head forwards) / backbone forwards; the median over repeats."""
    rows = {}
    parts = [model.backbone] + ([model.head] if model.head is not None else [])
    for label, kwargs in (("static", {}), ("speculative", {"mrp_mode": "speculative"})):
        if label == "speculative" and model.head is None:
            continue
        model.generate(ids, attention_mask=mask, **generate_kwargs, **kwargs)  # warm-up
        per_step, fractions = [], []
        for _ in range(repeats):
            inside, handles = _hook_seconds(parts, clock)
            try:
                start = clock()
                out = model.generate(ids, attention_mask=mask, return_dict_in_generate=True, **generate_kwargs, **kwargs)
                wall = clock() - start
            finally:
                for handle in handles:
                    handle.remove()
            per_step.append((wall - inside["seconds"]) / out.stats.backbone_forwards)
            fractions.append((wall - inside["seconds"]) / wall)
        rows[label] = {"overhead_ms_per_forward": _median_ms(per_step), "overhead_share_of_wall": round(statistics.median(fractions), 3),
                       "backbone_forwards": out.stats.backbone_forwards}
    return rows


def reference_inputs(batch: int):
    """The bundled reference DLM + head and `batch` held-out prompts (one of each task in turn)."""
    from mrp_hf.reference import held_out_items, load_reference
    from mrp_hf.reference.tasks import ANSWER_LENGTH

    model, tokenizer = load_reference(with_head=True)
    tokenizer.padding_side = "left"
    items = held_out_items(per_task=batch)
    prompts = [items[(i % 4) * batch + i // 4].prompt for i in range(batch)]
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    return model, encoded["input_ids"], encoded["attention_mask"], ANSWER_LENGTH


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--draft-tokens", type=int, default=3, help="K: the verify forward holds K+1 states")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, ids, mask, new_tokens = reference_inputs(args.batch)
    clock = Clock(torch.device("cpu"))
    block_length = model.backbone.config.block_size
    result = {
        "model": "bundled reference DLM + head", "batch": args.batch, "threads": torch.get_num_threads(),
        "draft_tokens": args.draft_tokens, "block_length": block_length,
        "backbone_layers": model.backbone.config.num_hidden_layers, "head_layers": model.head.config.num_hidden_layers,
        "head_width": model.head.config.head_hidden_size,
        **forward_costs(model.adapter, model.head, ids, mask, block_length, new_tokens, args.draft_tokens, args.repeats,
                        clock),
        "engine": engine_overhead(model, ids, mask, {"max_new_tokens": new_tokens}, max(3, args.repeats // 2), clock),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    return result


if __name__ == "__main__":
    main()
