"""Tiny mode of the examples (`--tiny`, or `MRP_EXAMPLES_TINY=1`): the reference DLM and MRP head that ship with
mrp-hf (`mrp_hf.reference`), their own task prompts and lengths, one CPU thread; seconds, offline.

The examples import this module only in tiny mode, so a script copied on its own still runs on real models.
"""

from __future__ import annotations

import sys
from pathlib import Path


def tiny_paths() -> tuple[str, str]:
    """(backbone folder, head folder) of the bundled reference model; one torch thread (its forwards are a few ms
    of small operations: more threads only wait for each other, the more so on a busy machine)."""
    import torch

    try:
        from mrp_hf.reference import bundled

        backbone, head = str(bundled.backbone_path()), str(bundled.head_path())
    except (ImportError, FileNotFoundError) as err:
        sys.exit(f"tiny mode runs on the reference model bundled with mrp-hf, which this installation lacks: {err}")
    torch.set_num_threads(1)
    print(f"tiny mode: the bundled reference DLM ({backbone}) and head, 1 torch thread")
    return backbone, head


def tiny_prompts(count: int = 1) -> list[str]:
    """Held-out prompts of the reference tasks, one task after another."""
    from mrp_hf.reference import TASKS, held_out_items

    per_task = -(-count // len(TASKS))
    items = held_out_items(per_task=per_task)
    by_task = [items[i::per_task] for i in range(per_task)]  # interleave the tasks
    return [item.prompt for group in by_task for item in group][:count]


def tiny_dataset(folder: Path, samples: int) -> str:
    """A JSONL file of training-split reference samples ({"prompt", "response"}), as `mrp-hf train` reads."""
    from mrp_hf.reference.train import export_head_data

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "reference-train.jsonl"
    export_head_data(str(path), samples=samples, seed=1)
    return str(path)
