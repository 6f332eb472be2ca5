"""Atomic training checkpoints: everything a resumed run needs to continue bit for bit.

Layout of `output_dir/checkpoint/`, written by `accelerate` (`Accelerator.save_state`) except where noted:
    model.safetensors          the prepared head's weights
    optimizer.bin              AdamW state
    scheduler.bin              the LR schedule's state (and `scaler.pt` with fp16 mixed precision)
    random_states_<rank>.pkl   python, numpy, torch and CUDA RNG states, per process
    data_rng_state_<rank>.pt   the generator that draws masks and reveals, per process (own code:
                               `register_for_checkpointing` saves custom objects from the main process only)
    trainer_state.json         optimizer step, epoch, batches consumed in the epoch, the training config
Under FSDP (`state_format: "fsdp"` in trainer_state.json) the head and optimizer are full state dicts gathered by
`training.distributed` and written here as `head.safetensors` and `optimizer.pt` (keyed by parameter name);
the schedule and RNG states still go through accelerate (`save_accelerator_state`). Why not accelerate's FSDP
saving: it follows the config's `state_dict_type` (sharded DCP folders by default) and offloads the full-state
gather to the CPU, which FSDP1 on a CPU process group cannot do (torch 2.13).

A checkpoint is written to `output_dir/.checkpoint-tmp`, then swapped in with renames, so an interruption
at any moment leaves either the previous checkpoint or the new one complete. A write that fails (a full disk
above all) removes the temporary folder and leaves the previous checkpoint as it was; a full disk is reported
as `NoSpaceLeftError` with the folder and the space needed. The finished head is written the same way
(`save_final`): into `.head-tmp`, then moved into `output_dir` with `config.json` last, so a folder holding a
head's `config.json` holds a complete head.

`prepare_output_dir` decides what a run may do with its output folder: refuse to start over a checkpoint or a
trained head unless asked to (`resume` continues, `overwrite` deletes them first), and recognise a finished run.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

CHECKPOINT = "checkpoint"
_TMP = ".checkpoint-tmp"
_OLD = ".checkpoint-old"
_HEAD_TMP = ".head-tmp"
STATE_FILE = "trainer_state.json"
#: the files of a complete checkpoint, by `state_format`, and those every process writes
_CHECKPOINT_FILES = {
    "plain": ("model.safetensors", "optimizer.bin", "scheduler.bin", STATE_FILE),
    "fsdp": ("head.safetensors", "optimizer.pt", "scheduler.bin", STATE_FILE),
}
_PROCESS_FILES = ("random_states_{rank}.pkl", "data_rng_state_{rank}.pt")
#: what a finished run writes into its output folder (`config.json` last)
HEAD_FILES = ("model.safetensors", "training_metrics.json", "config.json")


class OutputExistsError(FileExistsError):
    """The output folder holds a checkpoint or a trained head that the run was not told to continue or replace."""


class NoSpaceLeftError(OSError):
    """A checkpoint or the finished head did not fit on the disk (errno ENOSPC). `folder`, `needed_bytes` (an
    estimate of what was being written) and `free_bytes` (free after the partial files were removed)."""

    def __init__(self, message: str, folder: Path, needed_bytes: int, free_bytes: int | None):
        super().__init__(errno.ENOSPC, message)
        self.message = message
        self.folder = folder
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes

    def __str__(self) -> str:
        return self.message


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        state = json.loads((path / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _is_complete(path: Path) -> bool:
    """Every file of a checkpoint is there (a folder half-deleted after a crash is not a checkpoint)."""
    state = _read_state(path)
    if state is None or not all((path / name).is_file() for name in _CHECKPOINT_FILES.get(state.get("state_format"), ("?",))):
        return False
    processes = state.get("num_processes", 1)
    ranks = range(processes if isinstance(processes, int) else 1)
    return all((path / name.format(rank=rank)).is_file() for rank in ranks for name in _PROCESS_FILES)


def find_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The latest complete checkpoint (the previous one if a swap was interrupted), or None."""
    for name in (CHECKPOINT, _OLD):
        path = Path(output_dir) / name
        if _is_complete(path):
            return path
    return None


# ---------------------------------------------------------------------------------------- output folder
@dataclass
class OutputState:
    """What an output folder holds: a checkpoint (and its step), a trained head (and its step), and other files
    that a finished run would overwrite."""

    folder: Path
    checkpoint: Path | None = None
    checkpoint_step: int | None = None
    total_steps: int | None = None
    head_steps: int | None = None
    other_files: list[str] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        """The run is done: its trained head is saved, and no checkpoint is newer than it."""
        return self.head_steps is not None and (self.checkpoint_step is None or self.checkpoint_step <= self.head_steps)


def _trained_head_steps(folder: Path) -> int | None:
    """The optimizer steps of the trained MRP head saved in `folder` (None: no complete trained head there)."""
    if not (folder / "model.safetensors").is_file():
        return None
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    training = config.get("training") if isinstance(config, dict) and config.get("model_type") == "mrp" else None
    steps = training.get("steps") if isinstance(training, dict) else None
    return steps if isinstance(steps, int) else None


def inspect_output_dir(output_dir: str | os.PathLike) -> OutputState:
    folder = Path(output_dir)
    state = OutputState(folder)
    if not folder.is_dir():
        return state
    state.checkpoint = find_checkpoint(folder)
    if state.checkpoint is not None:
        saved = _read_state(state.checkpoint) or {}
        state.checkpoint_step, state.total_steps = saved.get("global_step"), saved.get("total_steps")
    state.head_steps = _trained_head_steps(folder)
    if state.head_steps is None:
        state.other_files = [name for name in HEAD_FILES if (folder / name).exists()]
    return state


def prepare_output_dir(output_dir: str | os.PathLike, *, resume: bool, overwrite: bool) -> OutputState:
    """Check what the run may do with `output_dir` (nothing is changed: with `overwrite`, `clear_output_dir`
    deletes once the run is ready to train, so that a run that fails on its data deletes nothing).

    Refuses (`OutputExistsError`) to start a new run over a checkpoint, a trained head or other files the head
    would overwrite, naming `resume` / `overwrite`; `resume` over a folder with only foreign files is refused
    too. Returns what the folder holds: with `resume`, `finished` says that there is nothing left to train."""
    if resume and overwrite:
        raise ValueError("resume=True and overwrite=True contradict each other: resume continues the checkpoint, "
                         "overwrite deletes it. Pass one of them.")
    state = inspect_output_dir(output_dir)
    folder = state.folder
    if overwrite:
        return state
    if resume and (state.checkpoint is not None or state.finished):
        return state
    if state.checkpoint is not None:
        progress = f"step {state.checkpoint_step}" + (f" of {state.total_steps}" if state.total_steps else "")
        raise OutputExistsError(
            f"{folder} already holds a training checkpoint ({progress}); a new run would overwrite it. Pass --resume "
            f"(resume=True) to continue it, or --overwrite (overwrite=True) to delete it and start over."
        )
    if state.head_steps is not None:
        raise OutputExistsError(
            f"{folder} already holds a trained head (a finished run of {state.head_steps} steps); a new run would "
            f"overwrite it. Choose another output folder, or pass --overwrite (overwrite=True) to delete it and "
            f"train again."
        )
    if state.other_files:
        raise OutputExistsError(
            f"{folder} already holds {', '.join(state.other_files)}, which the trained head would overwrite (and no "
            f"checkpoint to resume). Choose an empty or new output folder, or pass --overwrite (overwrite=True) to "
            f"replace them."
        )
    return state


def clear_output_dir(output_dir: str | os.PathLike, accelerator=None) -> None:
    """`overwrite`: delete the checkpoints and the trained head's files of an earlier run (only those). Every
    process may call it; only the main process deletes, then all wait for it."""
    folder = Path(output_dir)
    if accelerator is None or accelerator.is_main_process:
        remove_checkpoints(folder)
        for name in HEAD_FILES:
            if (folder / name).is_file():
                (folder / name).unlink()
    if accelerator is not None:
        accelerator.wait_for_everyone()


# ---------------------------------------------------------------------------------------- full disks
def state_nbytes(value: Any) -> int:
    """Bytes of the tensors in a (nested) state dict: what writing it needs, give or take the file headers."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, Mapping):
        return sum(state_nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(state_nbytes(v) for v in value)
    return 0


def _free_bytes(folder: Path) -> int | None:
    for path in (folder, *folder.parents):
        if path.exists():
            try:
                return shutil.disk_usage(path).free
            except OSError:
                return None
    return None


def _format_bytes(count: int | None) -> str:
    if count is None:
        return "unknown"
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


#: how torch.save reports a failed write (it drops the errno): "[enforce fail at inline_container.cc:...] .
#: unexpected pos 576 vs 534", "PytorchStreamWriter failed writing file ...: file write failed"
_TORCH_WRITE_FAILURES = ("inline_container", "PytorchStreamWriter", "file write failed")


def is_disk_full(error: BaseException, folder: Path, needed_bytes: int) -> bool:
    """Whether `error`, raised while writing about `needed_bytes` into `folder`, means the disk is full:
    ENOSPC / EDQUOT, a library's message saying so (safetensors: "No space left on device (os error 28)"), or
    torch's errno-less write failure while the folder has less free space than the write needs."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(error)
    if "No space left on device" in text or "os error 28" in text or "Disk quota exceeded" in text:
        return True
    if isinstance(error, RuntimeError) and any(marker in text for marker in _TORCH_WRITE_FAILURES):
        free = _free_bytes(folder)
        return free is not None and free < needed_bytes
    return False


def _no_space(error: BaseException, folder: Path, needed_bytes: int, written: Path, what: str, after: str) -> NoSpaceLeftError | None:
    """Remove the partial `written` folder; a `NoSpaceLeftError` if the disk was full, else None."""
    full = is_disk_full(error, folder, needed_bytes)
    shutil.rmtree(written, ignore_errors=True)
    if not full:
        return None
    free = _free_bytes(folder)
    return NoSpaceLeftError(
        f"No space left on device while writing {what} to {folder}: it needs about {_format_bytes(needed_bytes)} "
        f"free ({_format_bytes(free)} free now). The partial files were removed; {after}",
        folder, needed_bytes, free,
    )


def _kept_checkpoint(output_dir: Path, finished: bool = False) -> str:
    """What survives a failed write, and how to go on."""
    found = find_checkpoint(output_dir)
    if found is None:
        return "there is no earlier checkpoint: free some space and start the run again."
    step = (_read_state(found) or {}).get("global_step")
    if finished:
        return (f"nothing is lost: the checkpoint {found} (step {step}) holds the trained state; free some space and "
                f"rerun with --resume to write the head.")
    return f"the previous checkpoint {found} (step {step}) is intact: free some space and continue with --resume."


def save_checkpoint(
    accelerator,
    output_dir: str | os.PathLike,
    data_generator: torch.Generator,
    trainer_state: dict[str, Any],
    needed_bytes: int,
    full_states: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None,
    scheduler=None,
) -> Path:
    """Write a checkpoint from every process (collective: all processes must call it).

    Without FSDP (`full_states` None) `accelerator.save_state` writes the prepared head, optimizer, schedule and
    RNG states. Under FSDP, `full_states` = the gathered (head, optimizer) state dicts (read on the main process
    only; the others may pass None) and the `scheduler` go in as the module docstring says. `needed_bytes`:
    about what the main process writes, for the message on a full disk."""
    output_dir = Path(output_dir)
    tmp, final, old = output_dir / _TMP, output_dir / CHECKPOINT, output_dir / _OLD
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    try:
        _write_checkpoint(accelerator, tmp, data_generator, trainer_state, full_states, scheduler)
    except Exception as error:
        if not accelerator.is_main_process:  # the main process owns the folder (and may still be writing)
            raise
        full = _no_space(error, output_dir, needed_bytes + 64 * 1024, tmp, "the checkpoint", _kept_checkpoint(output_dir))
        if full is not None:
            raise full from error
        raise
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _fsync_dir(tmp)
        _swap_in(tmp, final, old)
        _fsync_dir(output_dir)
    accelerator.wait_for_everyone()
    return final


def _write_checkpoint(accelerator, tmp: Path, data_generator, trainer_state, full_states, scheduler) -> None:
    rank = accelerator.process_index
    torch.save(data_generator.get_state(), tmp / _PROCESS_FILES[1].format(rank=rank))
    if full_states is None:
        accelerator.save_state(str(tmp))
    else:
        from accelerate.checkpointing import save_accelerator_state

        if accelerator.is_main_process:
            head_state, optimizer_state = full_states
            weights = {k: v.detach().contiguous().cpu() for k, v in head_state.items()}
            save_file(weights, str(tmp / "head.safetensors"), metadata={"format": "pt"})
            torch.save(optimizer_state, tmp / "optimizer.pt")
        save_accelerator_state(
            str(tmp), model_states=[], optimizers=[], schedulers=[scheduler], dataloaders=[], process_index=rank,
            step=accelerator.step, scaler=accelerator.scaler,
        )
    if accelerator.is_main_process:
        (tmp / STATE_FILE).write_text(json.dumps(trainer_state, indent=2, sort_keys=True) + "\n")


def _swap_in(tmp: Path, final: Path, old: Path) -> None:
    """Replace `final` by the complete `tmp` so that at every moment `final` or `old` is a complete checkpoint."""
    if not _is_complete(final) and _is_complete(old):
        # an earlier swap stopped between its renames: `old` is the only complete checkpoint; make it `final`
        # before deleting anything, or a crash while deleting would leave no checkpoint at all
        shutil.rmtree(final, ignore_errors=True)
        os.replace(old, final)
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    try:
        os.replace(tmp, final)
    except OSError:
        if old.exists() and not final.exists():
            os.replace(old, final)  # put the previous checkpoint back
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def save_final(output_dir: str | os.PathLike, write: Callable[[Path], None], needed_bytes: int) -> None:
    """Write a finished run's files with `write(folder)` into `output_dir/.head-tmp`, then move them into
    `output_dir`, `config.json` last. On a full disk the partial files are removed and `NoSpaceLeftError`
    says how much space is needed (the checkpoint of the finished run stays: resume writes the head)."""
    output_dir = Path(output_dir)
    tmp = output_dir / _HEAD_TMP
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write(tmp)
    except Exception as error:
        full = _no_space(error, output_dir, needed_bytes, tmp, "the trained head", _kept_checkpoint(output_dir, finished=True))
        if full is not None:
            raise full from error
        raise
    _fsync_dir(tmp)
    for name in sorted(os.listdir(tmp), key=lambda n: n == "config.json"):  # config.json marks a complete head
        os.replace(tmp / name, output_dir / name)
    shutil.rmtree(tmp, ignore_errors=True)
    _fsync_dir(output_dir)


def load_checkpoint(
    path: str | os.PathLike,
    accelerator,
    data_generator: torch.Generator,
    state_format: str = "plain",
    load_full_states: tuple[Callable[[dict[str, torch.Tensor]], None], Callable[[dict[str, Any]], None]] | None = None,
    scheduler=None,
) -> dict[str, Any]:
    """Restore a checkpoint on every process: `accelerator.load_state`, or under FSDP the full head and optimizer
    states through `load_full_states` = (load_head, load_optimizer) and the `scheduler` and RNG states through
    accelerate's `load_accelerator_state`; then this process's noise generator. Returns the trainer state."""
    path = Path(path)
    state = json.loads((path / STATE_FILE).read_text())
    saved_format, processes = state.get("state_format", "plain"), state.get("num_processes", 1)
    if saved_format != state_format:
        raise ValueError(
            f"{path} was written by a {saved_format!r} run and this run is {state_format!r} (FSDP checkpoints hold "
            f"full state dicts, the others accelerate's state): resume under the same setting."
        )
    if processes != accelerator.num_processes:
        raise ValueError(
            f"{path} was written by {processes} processes and {accelerator.num_processes} are resuming it: the RNG "
            f"states and the data shards are per process. Resume with {processes} processes."
        )
    if load_full_states is None:
        accelerator.load_state(str(path))
    else:
        from accelerate.checkpointing import load_accelerator_state

        load_head, load_optimizer = load_full_states
        load_head(load_file(str(path / "head.safetensors"), device="cpu"))
        load_optimizer(torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True))
        restored = load_accelerator_state(
            str(path), models=[], optimizers=[], schedulers=[scheduler], dataloaders=[],
            process_index=accelerator.process_index, scaler=accelerator.scaler,
        )
        accelerator.step = restored.get("step", accelerator.step)
    rng_file = path / _PROCESS_FILES[1].format(rank=accelerator.process_index)
    data_generator.set_state(torch.load(rng_file, map_location="cpu", weights_only=True))
    return state


def remove_checkpoints(output_dir: str | os.PathLike) -> None:
    for name in (CHECKPOINT, _TMP, _OLD, _HEAD_TMP):
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
