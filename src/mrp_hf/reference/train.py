"""Train the reference DLM, and export head-training data for it.

    python -m mrp_hf.reference.train backbone --output runs/reference-backbone     # seeded, about 40 min on 2 CPU cores
    python -m mrp_hf.reference.train head-data --output runs/reference-head.jsonl   # JSONL for `mrp-hf train`

Training is SDAR-style block diffusion on the synthetic tasks of `tasks.py`. A row is laid out as
[prompt | noisy answer | clean answer]: the prompt left-padded to `PROMPT_LENGTH` columns, the answer (then EOS
up to `ANSWER_LENGTH`) twice (the clean copy without its last block, which no noisy block reads). Each answer block of the noisy copy is masked at its own rate t ~ U(eps, 1) and
attends to the prompt, to the *clean* copies of the earlier answer blocks, and to itself, which is exactly
what it sees at decoding time (finished blocks in the prefix cache, the current block partly masked). The
clean copy is block-causal over itself. Both copies carry the same position ids. The loss is the
cross-entropy on masked positions, so every answer block is trained in one forward.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .configuration_reference import ReferenceDLMConfig
from .modeling_reference import ReferenceDLM
from .tasks import ANSWER_LENGTH, PROMPT_LENGTH, TASKS, held_out_items, training_sample
from .tokenizer import build_tokenizer

#: the shipped model's architecture: deep and narrow, so that a 1-layer head costs about a tenth of a backbone
#: forward (as a 3-layer head does on a 36-layer deployment model), and small enough to train in ~40 minutes on
#: 2 CPU cores
MODEL_DEFAULTS = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=20, num_attention_heads=4, block_size=8,
                      block_position_embedding=True)


#: the shipped generation config ranks confidences on this grid: most positions of an answer block are
#: near-certain, and an order decided by differences below it is one no MRP head can predict (docs/benchmarks.md)
CONFIDENCE_RESOLUTION = 0.05


def encode(tokenizer, prompt: str, answer: str | None) -> tuple[list[int], list[int] | None]:
    """Prompt ids, and answer ids followed by EOS up to ANSWER_LENGTH (the sequence the model learns to fill)."""
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if len(prompt_ids) > PROMPT_LENGTH:
        raise ValueError(f"prompt {prompt!r} is longer than {PROMPT_LENGTH} tokens.")
    if answer is None:
        return prompt_ids, None
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    if len(answer_ids) >= ANSWER_LENGTH:
        raise ValueError(f"answer {answer!r} does not fit {ANSWER_LENGTH - 1} tokens + EOS.")
    return prompt_ids, answer_ids + [tokenizer.eos_token_id] * (ANSWER_LENGTH - len(answer_ids))


def training_pattern(prompt_mask: torch.Tensor, block: int) -> torch.Tensor:
    """Bool [B, 1, T, T] for rows [prompt (P) | noisy answer (A) | clean answer blocks but the last (A - block)]."""
    batch = prompt_mask.shape[0]
    p, a = PROMPT_LENGTH, ANSWER_LENGTH
    total = p + a + (a - block)  # the last clean block would be seen by no noisy block: it is left out
    index = torch.arange(total)
    region = torch.where(index < p, 0, torch.where(index < p + a, 1, 2))  # 0 prompt, 1 noisy, 2 clean
    # block number in decoding order: prompt blocks, then answer blocks (the two copies share numbers)
    number = torch.where(region == 0, index // block, p // block + ((index - p) % a) // block)
    q_region, k_region = region[:, None], region[None, :]
    q_number, k_number = number[:, None], number[None, :]
    sees = (
        ((k_region == 0) & (k_number <= q_number))  # the prompt, block-causally
        | ((q_region == 1) & (k_region == 1) & (k_number == q_number))  # a noisy block sees itself
        | ((q_region == 1) & (k_region == 2) & (k_number < q_number))  # ... and the clean earlier answer blocks
        | ((q_region == 2) & (k_region == 2) & (k_number <= q_number))  # the clean copy is block-causal
    )
    keys = torch.cat([prompt_mask.bool(), torch.ones(batch, total - p, dtype=torch.bool)], dim=1)
    pattern = sees[None] & keys[:, None, :]
    return (pattern | torch.eye(total, dtype=torch.bool)[None])[:, None]


def make_batch(tokenizer, rng: random.Random, generator: torch.Generator, batch_size: int, block: int,
               mask_eps: float = 0.02):
    """input_ids, attention pattern, position ids and labels of one training batch."""
    mask_id, pad_id = tokenizer.mask_token_id, tokenizer.pad_token_id
    p, a = PROMPT_LENGTH, ANSWER_LENGTH
    prompts = torch.full((batch_size, p), pad_id, dtype=torch.long)
    answers = torch.empty(batch_size, a, dtype=torch.long)
    for row in range(batch_size):
        _, prompt, answer = training_sample(rng)
        prompt_ids, answer_ids = encode(tokenizer, prompt, answer)
        prompts[row, p - len(prompt_ids):] = torch.tensor(prompt_ids)
        answers[row] = torch.tensor(answer_ids)
    prompt_mask = prompts != pad_id
    # a mask rate per (row, answer block); at least one masked position per block
    blocks = a // block
    rate = mask_eps + (1 - mask_eps) * torch.rand(batch_size, blocks, generator=generator)
    masked = torch.rand(batch_size, a, generator=generator) < rate.repeat_interleave(block, dim=1)
    forced = torch.randint(0, block, (batch_size, blocks), generator=generator) + torch.arange(0, a, block)
    masked.scatter_(1, forced, True)
    noisy = torch.where(masked, mask_id, answers)
    input_ids = torch.cat([prompts, noisy, answers[:, : a - block]], dim=1)
    labels = torch.full_like(input_ids, -100)
    labels[:, p : p + a] = torch.where(masked, answers, -100)
    positions = torch.arange(p + a)
    position_ids = torch.cat([positions, positions[p : p + a - block]]).expand(batch_size, -1)
    return input_ids, training_pattern(prompt_mask, block), position_ids, labels


def evaluate_static(model, tokenizer, items, batch_size: int = 64) -> tuple[float, dict[str, float]]:
    """Held-out accuracy of static decoding (one token per step, greedy) with the project's engine: overall
    and per task."""
    from ..modeling_mrp import MRPModel

    wrapped = MRPModel.from_backbone(model)
    per_task: dict[str, list[bool]] = {}
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        encoded = tokenizer([item.prompt for item in chunk], return_tensors="pt", padding=True, add_special_tokens=False)
        out = wrapped.generate(encoded["input_ids"], attention_mask=encoded["attention_mask"],
                               max_new_tokens=ANSWER_LENGTH, tokens_per_step=1, temperature=0.0,
                               eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        width = encoded["input_ids"].shape[1]
        for item, row in zip(chunk, out[:, width:], strict=True):
            per_task.setdefault(item.task, []).append(item.check(tokenizer.decode(row, skip_special_tokens=True)))
    model.train()
    overall = sum(sum(v) for v in per_task.values()) / len(items)
    return overall, {task: round(sum(v) / len(v), 3) for task, v in sorted(per_task.items())}


def train_backbone(output_dir: str, steps: int = 2800, batch_size: int = 32, lr: float = 2e-3, warmup: int = 200,
                   seed: int = 0, eval_every: int = 400, eval_per_task: int = 20, threads: int | None = None,
                   stop_after: int | None = None, init_from: str | None = None, **model_kwargs) -> dict:
    """Train the reference DLM from scratch and save it (model, tokenizer, generation config, training info).

    `stop_after`: stop after that many steps of the `steps`-step schedule (the same weights as the full run's
    at that step, e.g. as its snapshot beside the output). `init_from`: a saved reference DLM to continue from
    (a second phase with its own schedule and seed; fresh optimizer state), instead of a random init."""
    from ..generation.config import MRPGenerationConfig

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    tokenizer = build_tokenizer()
    config = ReferenceDLMConfig(
        vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, max_position_embeddings=PROMPT_LENGTH + ANSWER_LENGTH,
        **{**MODEL_DEFAULTS, **model_kwargs},
    )
    model = ReferenceDLM.from_pretrained(init_from) if init_from else ReferenceDLM(config)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    )
    eval_items = held_out_items(per_task=eval_per_task, seed=seed + 1)
    history = []
    started = time.time()
    last = min(steps, stop_after or steps)
    bar = tqdm(range(last), desc="reference DLM", unit="step")
    for step in bar:
        input_ids, pattern, position_ids, labels = make_batch(tokenizer, rng, generator, batch_size, config.block_size)
        loss = model(input_ids, attention_mask=pattern, position_ids=position_ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < last:
            accuracy, per_task = evaluate_static(model, tokenizer, eval_items)
            history.append({"step": step + 1, "loss": loss.item(), "static_accuracy": accuracy, "per_task": per_task})
            bar.write(f"step {step + 1}: loss {loss.item():.3f}, held-out static accuracy {accuracy:.3f} {per_task}")
            # a snapshot beside the output (weights and config), so that a run stopped late is not all lost
            model.save_pretrained(Path(output_dir).with_name(Path(output_dir).name + "-latest"))
    train_seconds = time.time() - started
    model.eval()
    accuracy, per_task = evaluate_static(model, tokenizer, eval_items)
    history.append({"step": last, "loss": loss.item(), "static_accuracy": accuracy, "per_task": per_task})
    info = {
        "seed": seed, "steps": steps, "warmup": warmup, "stopped_after": stop_after, "init_from": init_from, "batch_size": batch_size, "lr": lr, "train_seconds": round(train_seconds, 1),
        "threads": torch.get_num_threads(), "tasks": sorted(TASKS), "history": history,
        "held_out_static_accuracy": accuracy, "held_out_static_accuracy_per_task": per_task, "eval_items": len(eval_items),
        "eval_per_task": eval_per_task,
    }
    if init_from and (Path(init_from) / "training_info.json").is_file():  # keep the earlier phase's record
        info["first_phase"] = json.loads((Path(init_from) / "training_info.json").read_text())
    out = Path(output_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _portable_tokenizer_class(out)
    MRPGenerationConfig(
        max_new_tokens=ANSWER_LENGTH, block_length=config.block_size, tokens_per_step=1, temperature=0.0,
        confidence_resolution=CONFIDENCE_RESOLUTION,
        mask_token_id=tokenizer.mask_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    ).save_pretrained(out)
    (out / "training_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def _portable_tokenizer_class(folder: Path) -> None:
    """transformers 5 records its tokenizer class as `TokenizersBackend`, which 4.x cannot load; the
    `PreTrainedTokenizerFast` name loads the same tokenizer under both."""
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2) + "\n")


def export_head_data(path: str, samples: int = 20000, seed: int = 1) -> None:
    """Training-split samples as `{"prompt", "response"}` JSONL; the response carries its EOS fill."""
    rng = random.Random(seed)
    fill = "[EOS]"
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(samples):
            task, prompt, answer = training_sample(rng)
            record = {"task": task, "prompt": prompt, "response": answer + fill * (ANSWER_LENGTH - len(answer))}
            f.write(json.dumps(record) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mrp_hf.reference.train", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("backbone", help="train the reference DLM from scratch")
    b.add_argument("--output", required=True)
    b.add_argument("--steps", type=int, default=2800)
    b.add_argument("--batch-size", type=int, default=32)
    b.add_argument("--lr", type=float, default=2e-3)
    b.add_argument("--warmup", type=int, default=200)
    b.add_argument("--init-from", default=None, help="continue from this saved reference DLM (a second phase)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--eval-every", type=int, default=400)
    b.add_argument("--eval-per-task", type=int, default=20)
    b.add_argument("--num-layers", type=int, default=MODEL_DEFAULTS["num_hidden_layers"])
    b.add_argument("--threads", type=int, default=None)
    b.add_argument("--stop-after", type=int, default=None, help="stop after N steps of the --steps schedule")
    b.add_argument("--attention", choices=["block_causal", "bidirectional"], default="block_causal")
    h = sub.add_parser("head-data", help="write training-split JSONL for `mrp-hf train`")
    h.add_argument("--output", required=True)
    h.add_argument("--samples", type=int, default=20000)
    h.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.command == "backbone":
        info = train_backbone(args.output, steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup=args.warmup, seed=args.seed,
                              eval_every=args.eval_every, eval_per_task=args.eval_per_task, threads=args.threads,
                              attention=args.attention, num_hidden_layers=args.num_layers, stop_after=args.stop_after,
                              init_from=args.init_from)
        print(json.dumps({k: v for k, v in info.items() if k != "history"}, indent=2))
    else:
        export_head_data(args.output, samples=args.samples, seed=args.seed)
        print(f"wrote {args.samples} samples to {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
