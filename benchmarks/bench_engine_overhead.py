"""How much time the decoding engine adds on top of the backbone forwards it runs.

For each configuration (family x decoding mode) the script times, in the same process and interleaved:

* engine: ``MRPModel.from_backbone(model, mask_token_id=...).generate(ids, ..., return_dict_in_generate=True)``;
* bare:   a plain loop that calls the backbone model directly, under ``torch.no_grad()``, with inputs of the
          same shapes, exactly ``out.stats.backbone_forwards`` times. Its inputs (ids, masks, positions)
          are built before the clock starts, so it is the pure cost of the forwards: a lower bound for any
          decoding loop. For the block-causal family with the exact prefix cache the bare loop does the
          same cached forwards as the engine (first forward of a block: every uncached position up to the
          block end, i.e. prompt + block for the first block and previous block + block afterwards; then
          block-only forwards; after each forward the ``DynamicCache`` is cropped back to the block start
          with ``crop(-n)``), so both sides run forwards of identical lengths.

Before timing, one engine run and one bare run are recorded with a forward pre-hook on the backbone and
compared call by call (keyword names, tensor shapes, cache length before the call): the script refuses to
report a configuration where the bare loop does not do exactly the engine's forwards.

Models are the repository's remote-code stand-ins (``tests/stand_ins``) and a transformers
``BertForMaskedLM``, enlarged so that one forward takes a few to tens of ms on a CPU (see ``--help``);
weights are random (seeded), so only the timing is meaningful. EOS is switched off so that every run
decodes all ``max_new_tokens``.

Usage::

    python benchmarks/bench_engine_overhead.py                 # full run (a few minutes on 2 CPU cores)
    python benchmarks/bench_engine_overhead.py --quick         # tiny models, seconds
    python benchmarks/bench_engine_overhead.py --json rows.json --threads 2 --repeats 9

`ratio` is the median over repeats of engine time / bare time (each repeat runs both back to back);
`+ms/fwd` is (median engine - median bare) / forwards. The target is ratio <= 1.10.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # makes the `stand_ins` package importable

MASK_ID = 126  # the stand-ins' mask id (any id inside the vocabulary works for BERT)
TARGET_RATIO = 1.10


# ---------------------------------------------------------------------------------------------- models
@dataclass(frozen=True)
class Size:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    max_positions: int = 1024


FULL = Size(hidden=256, layers=4, heads=8, intermediate=704, vocab=8192)
QUICK = Size(hidden=64, layers=2, heads=4, intermediate=128, vocab=1024)


def build_model(family: str, size: Size, workdir: Path) -> torch.nn.Module:
    """A random-weight model of `family` at `size`, in eval mode, with EOS switched off."""
    if family == "bert":
        from transformers import BertConfig, BertForMaskedLM

        torch.manual_seed(0)
        config = BertConfig(
            vocab_size=size.vocab,
            hidden_size=size.hidden,
            num_hidden_layers=size.layers,
            num_attention_heads=size.heads,
            intermediate_size=size.intermediate,
            max_position_embeddings=size.max_positions,
        )
        model = BertForMaskedLM(config)
        with torch.no_grad():  # BERT's 0.02 init gives near-uniform logits: peak them (about 2.5 tokens per forward at threshold 0.5)
            embeddings = model.get_input_embeddings().weight  # tied to the MLM decoder
            embeddings.copy_(0.28 * torch.randn(embeddings.shape, generator=torch.Generator().manual_seed(0)))
    else:
        from stand_ins import load_stand_in

        if family == "llada":
            overrides = dict(
                d_model=size.hidden,
                n_heads=size.heads,
                n_kv_heads=size.heads,
                n_layers=size.layers,
                mlp_hidden_size=size.intermediate,
                vocab_size=size.vocab,
                embedding_size=size.vocab,
                max_sequence_length=size.max_positions,
            )
        elif family == "sdar":
            overrides = dict(
                hidden_size=size.hidden,
                num_attention_heads=size.heads,
                num_key_value_heads=size.heads,
                head_dim=size.hidden // size.heads,
                num_hidden_layers=size.layers,
                intermediate_size=size.intermediate,
                vocab_size=size.vocab,
                max_position_embeddings=size.max_positions,
            )
        else:
            raise ValueError(f"no bare loop for family {family!r}; choose llada, sdar or bert")
        model = load_stand_in(family, workdir, **overrides)
    model.eval()
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.eos_token_id = None  # decode every new token: a fixed amount of work
    return model


# ---------------------------------------------------------------------------------------------- bare loops
def block_causal_mask(in_start: int, end: int, grid: int, batch: int, device) -> torch.Tensor:
    """Bool [batch, 1, q, kv]: queries in_start..end-1 see keys of their own block and earlier ones."""
    query_block = torch.arange(in_start, end, device=device) // grid
    key_block = torch.arange(end, device=device) // grid
    allowed = key_block[None, :] <= query_block[:, None]
    return allowed[None, None].expand(batch, 1, -1, -1)


class BareLoop:
    """The backbone's forwards, and nothing else, for one configuration. The constructor builds every input
    (outside the timed region); `run` does the forwards."""

    def __init__(self, family: str, model, canvas: torch.Tensor, width: int, block: int, counts: list[int]):
        self.family, self.model, self.canvas, self.width, self.block = family, model, canvas, width, block
        self.counts = counts  # forwards per decoding block, as the engine did them
        batch, total = canvas.shape
        self.full_mask = torch.ones_like(canvas)
        self.positions = torch.arange(total, device=canvas.device).unsqueeze(0).expand(batch, -1)
        self.calls: list[tuple[int, int]] = []  # (in_start, end) per cached forward
        self.masks: dict[tuple[int, int], torch.Tensor] = {}
        self.cached = family == "sdar"
        if self.cached:
            self._prepare_cached()

    def _prepare_cached(self) -> None:
        """The engine's exact-prefix-cache schedule: the cache holds everything before the block start
        after each forward, so the first forward of a block re-reads the previous block (or the prompt)."""
        batch = self.canvas.shape[0]
        cache_len = 0
        for b, n in enumerate(self.counts):
            start = self.width + b * self.block
            end = start + self.block
            for _ in range(n):
                self.calls.append((cache_len, end))
                if (cache_len, end) not in self.masks:
                    self.masks[(cache_len, end)] = block_causal_mask(cache_len, end, self.block, batch, self.canvas.device)
                cache_len = start  # cropped back to the block start

    def run(self) -> None:
        model, canvas = self.model, self.canvas
        if not self.cached:
            # bidirectional, no cache: every forward reads the whole canvas
            kwargs: dict[str, Any] = {"input_ids": canvas, "attention_mask": self.full_mask}
            if self.family == "bert":
                kwargs["position_ids"] = self.positions
            else:  # llada
                kwargs["use_cache"] = False
            for _ in range(sum(self.counts)):
                model(**kwargs)
            return
        from transformers import DynamicCache

        cache = DynamicCache()
        for in_start, end in self.calls:
            model(
                input_ids=canvas[:, in_start:end],
                attention_mask=self.masks[(in_start, end)],
                position_ids=self.positions[:, in_start:end],
                past_key_values=cache,
                use_cache=True,
                store_kv=True,
            )
            excess = cache.get_seq_length() - (end - self.block)
            if excess > 0:  # back to the block start, as the engine's crop_cache does (crop(-n): 4.x and 5.x)
                cache.crop(-excess)


# ---------------------------------------------------------------------------------------------- recording
class ForwardRecorder:
    """Forward pre-hook noting each call's keyword names, tensor shapes and cache length."""

    def __init__(self, model):
        self.model = model
        self.calls: list[tuple] = []

    def __enter__(self):
        self.handle = self.model.register_forward_pre_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc):
        self.handle.remove()

    def _hook(self, _module, args, kwargs):
        summary = []
        for name in sorted(kwargs):
            value = kwargs[name]
            if isinstance(value, torch.Tensor):
                summary.append((name, tuple(value.shape), str(value.dtype)))
            elif hasattr(value, "get_seq_length"):
                summary.append((name, "cache", int(value.get_seq_length())))
            elif value is not None:
                summary.append((name, repr(value)))
        self.calls.append((len(args), tuple(summary)))

    def shapes(self) -> list[tuple[int, int]]:
        """(cache length before, input length) per call."""
        out = []
        for _, summary in self.calls:
            fields = {item[0]: item for item in summary}
            cache = fields.get("past_key_values") or fields.get("cache")
            out.append((cache[2] if cache else 0, fields["input_ids"][1][1]))
        return out


# ---------------------------------------------------------------------------------------------- timing
@dataclass
class Row:
    family: str
    attention: str
    cache: str
    mode: str
    device: str
    threads: int
    batch: int
    prompt_len: int
    new_tokens: int
    block_length: int
    forwards: int
    tokens_per_forward: float
    engine_s: float
    bare_s: float
    ratio: float
    overhead_ms_per_forward: float
    cpu_ratio: float  # the same ratio on process CPU time (less sensitive to other load on the machine)
    engine_samples: list[float] = field(default_factory=list)  # wall seconds per repeat
    bare_samples: list[float] = field(default_factory=list)
    engine_cpu_samples: list[float] = field(default_factory=list)  # process CPU seconds per repeat
    bare_cpu_samples: list[float] = field(default_factory=list)


def timed(fn, device: torch.device) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) for one call of `fn`."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start, start_cpu = time.perf_counter(), time.process_time()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, time.process_time() - start_cpu


def bench_config(family, model, mode, args, device) -> Row:
    import mrp_hf

    mrp = mrp_hf.MRPModel.from_backbone(model, mask_token_id=MASK_ID)
    adapter = mrp.adapter
    batch, prompt_len, new, block = args.batch, args.prompt_len, args.new_tokens, args.block_length
    generator = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, MASK_ID - 2, (batch, prompt_len), generator=generator).to(device)
    gen_kwargs: dict[str, Any] = dict(max_new_tokens=new, block_length=block, return_dict_in_generate=True)
    if mode == "dynamic":
        gen_kwargs["threshold"] = args.threshold

    def engine():
        return mrp.generate(ids, **gen_kwargs)

    with torch.no_grad():
        # record the engine's forwards (this is also the first warm-up run)
        with ForwardRecorder(model) as engine_rec:
            out = engine()
        stats = out.stats
        width = out.sequences.shape[1] - new
        if width != prompt_len:
            raise SystemExit(f"{family}: the engine padded the prompt ({prompt_len} -> {width}); use a prompt_len "
                             f"that is a multiple of block_length")
        if adapter.exact_prefix_cache:
            # forwards per block, from the block end each recorded forward reached
            ends = Counter(cache_len + length for cache_len, length in engine_rec.shapes())
            counts = [ends.get(width + (b + 1) * block, 0) for b in range(new // block)]
        else:
            counts = [stats.backbone_forwards]
        if sum(counts) != stats.backbone_forwards:
            raise SystemExit(f"{family}/{mode}: could not attribute the engine's forwards to blocks: {counts}")
        bare = BareLoop(family, model, out.sequences.clone(), width, block, counts)
        with ForwardRecorder(model) as bare_rec:
            bare.run()
        if bare_rec.calls != engine_rec.calls:
            if len(bare_rec.calls) != len(engine_rec.calls):
                diff = f"{len(bare_rec.calls)} calls vs {len(engine_rec.calls)}"
            else:
                diff = next(i for i, (a, b) in enumerate(zip(bare_rec.calls, engine_rec.calls, strict=True)) if a != b)
            raise SystemExit(
                f"{family}/{mode}: the bare loop's forwards differ from the engine's (first difference: call {diff})\n"
                f"engine: {engine_rec.calls[:3]}\nbare:   {bare_rec.calls[:3]}"
            )

        for _ in range(args.warmup):
            engine()
            bare.run()
        samples: dict[str, list[tuple[float, float]]] = {"engine": [], "bare": []}
        for r in range(args.repeats):
            pair = [("engine", engine), ("bare", bare.run)]
            if r % 2:  # alternate the order so that drift in machine load hits both sides alike
                pair.reverse()
            for name, fn in pair:
                samples[name].append(timed(fn, device))
    engine_samples, engine_cpu = [w for w, _ in samples["engine"]], [c for _, c in samples["engine"]]
    bare_samples, bare_cpu = [w for w, _ in samples["bare"]], [c for _, c in samples["bare"]]

    engine_s, bare_s = statistics.median(engine_samples), statistics.median(bare_samples)
    # the ratio is the median of the per-repeat ratios: the two runs of a repeat are back to back, so a
    # change in machine load between repeats cancels out
    ratio = statistics.median(e / b for e, b in zip(engine_samples, bare_samples, strict=True))
    cpu_ratio = statistics.median(e / b for e, b in zip(engine_cpu, bare_cpu, strict=True))
    forwards = stats.backbone_forwards
    return Row(
        family=family,
        attention=adapter.attention_pattern,
        cache="exact prefix" if adapter.exact_prefix_cache else "none",
        mode="static (1 token/step)" if mode == "static" else f"dynamic (threshold {args.threshold})",
        device=str(device),
        threads=torch.get_num_threads(),
        batch=batch,
        prompt_len=prompt_len,
        new_tokens=new,
        block_length=block,
        forwards=forwards,
        tokens_per_forward=round(stats.mean_tokens_per_forward, 3),
        engine_s=round(engine_s, 5),
        bare_s=round(bare_s, 5),
        ratio=round(ratio, 4),
        overhead_ms_per_forward=round(1e3 * (engine_s - bare_s) / forwards, 3),
        cpu_ratio=round(cpu_ratio, 4),
        engine_samples=[round(s, 5) for s in engine_samples],
        bare_samples=[round(s, 5) for s in bare_samples],
        engine_cpu_samples=[round(s, 5) for s in engine_cpu],
        bare_cpu_samples=[round(s, 5) for s in bare_cpu],
    )


def print_table(rows: list[Row]) -> None:
    header = ("family", "cache", "mode", "fwd", "tok/fwd", "engine s", "bare s", "ratio", "+ms/fwd", "CPU ratio")
    lines = [
        (r.family, r.cache, r.mode, str(r.forwards), f"{r.tokens_per_forward:.2f}", f"{r.engine_s:.4f}",
         f"{r.bare_s:.4f}", f"{r.ratio:.3f}", f"{r.overhead_ms_per_forward:+.2f}", f"{r.cpu_ratio:.3f}")
        for r in rows
    ]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    fmt = " | ".join(f"{{:<{w}}}" for w in widths)
    print(fmt.format(*header))
    print("-+-".join("-" * w for w in widths))
    for line in lines:
        print(fmt.format(*line))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny models and few repeats (a smoke run)")
    parser.add_argument("--json", metavar="PATH", help="write the rows (and the set-up) as JSON")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--families", default="llada,sdar,bert", help="comma list of llada, sdar, bert")
    parser.add_argument("--modes", default="static,dynamic", help="comma list of static, dynamic")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per side (median; default 7, quick 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per side after the recorded one")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=None, help="default 64 (quick 16)")
    parser.add_argument("--new-tokens", type=int, default=None, help="default 64 (quick 16)")
    parser.add_argument("--block-length", type=int, default=None, help="default 16 (quick 8)")
    parser.add_argument("--threshold", type=float, default=0.5, help="confidence threshold of the dynamic mode")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (3 if args.quick else 7)
    args.prompt_len = args.prompt_len or (16 if args.quick else 64)
    args.new_tokens = args.new_tokens or (16 if args.quick else 64)
    args.block_length = args.block_length or (8 if args.quick else 16)
    size = QUICK if args.quick else FULL

    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, python {platform.python_version()}")
    print(f"device {device}, torch threads {torch.get_num_threads()} (machine CPUs: {os.cpu_count()})")
    print(f"model size {asdict(size)}; batch {args.batch}, prompt {args.prompt_len}, new {args.new_tokens}, "
          f"block {args.block_length}; warm-up 1 recorded + {args.warmup}, {args.repeats} timed repeats (median)")

    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as workdir:
        for family in args.families.split(","):
            model = build_model(family, size, Path(workdir)).to(device)
            for mode in args.modes.split(","):
                row = bench_config(family, model, mode, args, device)
                rows.append(row)
                print(f"  {family:6s} {mode:8s} forwards {row.forwards:4d}  engine {row.engine_s:.4f}s  "
                      f"bare {row.bare_s:.4f}s  ratio {row.ratio:.3f}  CPU-time ratio {row.cpu_ratio:.3f}", flush=True)
            del model
    print()
    print_table(rows)
    worst = max(r.ratio for r in rows)
    print(f"\nworst ratio {worst:.3f} (target <= {TARGET_RATIO:.2f}): {'OK' if worst <= TARGET_RATIO else 'ABOVE TARGET'}")
    if args.json:
        payload = {
            "argv": sys.argv[1:],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "threads": torch.get_num_threads(),
            "cpus": os.cpu_count(),
            "size": asdict(size),
            "rows": [asdict(r) for r in rows],
        }
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
