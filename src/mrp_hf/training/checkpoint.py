"""Atomic training checkpoints: everything a resumed run needs to continue bit for bit.

Layout of `output_dir/checkpoint/`:
    head.safetensors       the head's weights (the full, gathered weights under FSDP)
    optimizer.pt           AdamW state (tensors and numbers only: loaded with `weights_only=True`); keyed by
                           parameter index, or under FSDP the full state keyed by parameter name
                           (`state_format` in trainer_state.json says which)
    scheduler.pt           the LR scheduler's state
    rng_state_<rank>.pt    python `random`, torch (CPU and CUDA) and the data-noise generator, per process
    trainer_state.json     optimizer step, epoch, batches consumed in the epoch, the training config

A checkpoint is written to `output_dir/.checkpoint-tmp`, then swapped in with renames, so an interruption
at any moment leaves either the previous checkpoint or the new one complete.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

CHECKPOINT = "checkpoint"
_TMP = ".checkpoint-tmp"
_OLD = ".checkpoint-old"
STATE_FILE = "trainer_state.json"


def checkpoint_dir(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / CHECKPOINT


def find_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The latest complete checkpoint (the previous one if a swap was interrupted), or None."""
    for name in (CHECKPOINT, _OLD):
        path = Path(output_dir) / name
        if (path / STATE_FILE).is_file():
            return path
    return None


def rng_state(data_generator: torch.Generator) -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "data": data_generator.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any], data_generator: torch.Generator) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    data_generator.set_state(state["data"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    accelerator,
    output_dir: str | os.PathLike,
    head_state: dict[str, torch.Tensor] | None,
    optimizer_state: dict[str, Any] | None,
    scheduler,
    data_generator: torch.Generator,
    trainer_state: dict[str, Any],
) -> Path:
    """Write a checkpoint from every process (collective: all processes must call it). `head_state` and
    `optimizer_state` are only read on the main process (the others may pass None)."""
    output_dir = Path(output_dir)
    tmp, final, old = output_dir / _TMP, output_dir / CHECKPOINT, output_dir / _OLD
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    torch.save(rng_state(data_generator), tmp / f"rng_state_{accelerator.process_index}.pt")
    if accelerator.is_main_process:
        if head_state is None or optimizer_state is None:
            raise ValueError("the main process must pass the head and optimizer states")
        weights = {k: v.detach().contiguous().cpu() for k, v in head_state.items()}
        save_file(weights, str(tmp / "head.safetensors"), metadata={"format": "pt"})
        torch.save(optimizer_state, tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        (tmp / STATE_FILE).write_text(json.dumps(trainer_state, indent=2, sort_keys=True) + "\n")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _fsync_dir(tmp)
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
        _fsync_dir(output_dir)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(
    path: str | os.PathLike,
    accelerator,
    load_head: Callable[[dict[str, torch.Tensor]], None],
    load_optimizer: Callable[[dict[str, Any]], None],
    scheduler,
    data_generator: torch.Generator,
    state_format: str = "plain",
) -> dict[str, Any]:
    """Restore a checkpoint (every process reads it): the head's weights and the optimizer state go to the
    given loaders, the schedule and this process's RNG states in place. Returns the trainer state."""
    path = Path(path)
    state = json.loads((path / STATE_FILE).read_text())
    saved_format = state.get("state_format", "plain")
    if saved_format != state_format:
        raise ValueError(
            f"{path} was written by a {saved_format!r} run and this run is {state_format!r} (FSDP checkpoints key "
            f"the optimizer state by parameter name, the others by index): resume under the same setting."
        )
    load_head(load_file(str(path / "head.safetensors"), device="cpu"))
    load_optimizer(torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", map_location="cpu", weights_only=True))
    rng_file = path / f"rng_state_{accelerator.process_index}.pt"
    if not rng_file.is_file():
        raise FileNotFoundError(
            f"{rng_file} is missing: this checkpoint was written by fewer processes than are resuming it now "
            f"({accelerator.num_processes}); resume with the same number of processes."
        )
    set_rng_state(torch.load(rng_file, map_location="cpu", weights_only=True), data_generator)
    return state


def remove_checkpoints(output_dir: str | os.PathLike) -> None:
    for name in (CHECKPOINT, _TMP, _OLD):
        shutil.rmtree(Path(output_dir) / name, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
