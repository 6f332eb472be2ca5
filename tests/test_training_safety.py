"""Head training must not lose completed work or start on bad data (issue 10, sections 4 and 5).

- every training record is checked before anything trains: file and line of each bad one;
- a new run refuses an output folder holding a checkpoint or a trained head (`--resume` / `--overwrite`);
- `--resume` on a finished run trains nothing and exits 0;
- a full disk while checkpointing or saving the head raises "No space left on device" with the folder and the
  space needed, removes the partial files and keeps the previous checkpoint loadable;
- a crash at any moment of a checkpoint swap (or `kill -9` at random moments) never loses a step.
"""

import errno
import gc
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import accelerate.utils.other as accelerate_io
import pytest
import torch
from safetensors import SafetensorError
from stand_ins import save_stand_in

import mrp_hf.training.checkpoint as checkpoint_module
from mrp_hf import MRPHead
from mrp_hf.cli import main as cli_main
from mrp_hf.training import (
    MRPTrainingConfig,
    NoSpaceLeftError,
    OutputExistsError,
    TrainingDataError,
    TrainingInterrupted,
    read_records,
    train_head,
)
from mrp_hf.training.checkpoint import find_checkpoint

VOCAB = 128  # the stand-ins' vocabulary


# a finished head folder: the head's files (with the code files its auto_map and custom_generate/ need), the metrics
HEAD_FOLDER = ["config.json", "configuration_mrp.py", "custom_generate", "model.safetensors", "modeling_mrp.py",
               "training_metrics.json"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
    return save_stand_in("sdar", tmp_path_factory.mktemp("safety_backbone") / "sdar")


def id_records(count, seed=0):
    rng = random.Random(seed)
    return [
        {"prompt_ids": [rng.randint(4, 60) for _ in range(rng.randint(3, 8))],
         "response_ids": [rng.randint(61, 120) for _ in range(rng.randint(3, 8))]}
        for _ in range(count)
    ]


RECORDS = id_records(44, seed=5)


def config(**overrides):
    values = dict(
        max_length=32, batch_size=8, max_steps=6, save_every=2, eval_every=3, num_hidden_layers=1,
        trust_remote_code=True, disable_progress=True, eval_fraction=0.1,
    )
    values.update(overrides)
    return MRPTrainingConfig(**values)


@pytest.fixture(scope="module")
def straight(backbone, tmp_path_factory):
    """The uninterrupted run every interrupted one must reproduce bit for bit."""
    out = tmp_path_factory.mktemp("safety_straight") / "head"
    return train_head(str(backbone), RECORDS, out, config=config()).state_dict()


def assert_same_weights(head, reference):
    state = head.state_dict()
    assert state.keys() == reference.keys()
    for name, value in reference.items():
        assert torch.equal(state[name], value), name


def steps_counter():
    steps = []
    return steps, lambda step, logs: steps.append(step)


def checkpoint_step(out):
    found = find_checkpoint(out)
    return None if found is None else json.loads((found / "trainer_state.json").read_text())["global_step"]


def stop_at(backbone, out, step):
    with pytest.raises(TrainingInterrupted):
        train_head(str(backbone), RECORDS, out, config=config(stop_after=step))
    assert checkpoint_step(out) == step


# ------------------------------------------------------------------------------------------ data
BAD_LINES = [
    (b"5", "is a number, not an object"),
    (b"null", "is null, not an object"),
    (b"[1, 2]", "is a list, not an object"),
    (b'"text"', "is a string, not an object"),
    (b'{"prompt": "t5", "response": ', "not valid JSON"),
    (b'{"prompt": "t5 \xff\xfe", "response": "t6"}', "invalid UTF-8 (byte 0xff"),
    (b'{"prompt": 5, "response": "t6"}', "'prompt' is a number; it must be a string"),
    (b'{"prompt": "t5", "response": "  "}', "'response' is empty"),
    (b'{"prompt": "t5"}', "has 'prompt' but no 'response'"),
    (b'{"text": "t5"}', "has keys ['text']"),
    (b'{"prompt_ids": [5, 6.5], "response_ids": [7]}', "'prompt_ids'[1] is 6.5, not an integer token id"),
    (b'{"prompt_ids": [5, true], "response_ids": [7]}', "'prompt_ids'[1] is True, not an integer token id"),
    (b'{"prompt_ids": [5], "response_ids": [-1]}', "'response_ids'[0] is -1: token ids are >= 0"),
    (b'{"prompt_ids": [5], "response_ids": []}', "'response_ids' is empty"),
    (b'{"prompt_ids": "5 6", "response_ids": [7]}', "'prompt_ids' is a string; it must be a list of token ids"),
    (b'{"messages": [{"role": "user", "content": "t5"}]}', "'messages' has no assistant turn"),
    (b'{"messages": []}', "'messages' is empty"),
    (b'{"messages": [{"role": "user", "content": null}]}', "'messages'[0]['content'] is null"),
]


@pytest.mark.parametrize(("line", "expected"), BAD_LINES, ids=[str(i) for i in range(len(BAD_LINES))])
def test_a_bad_jsonl_line_is_reported_with_file_and_line(tmp_path, line, expected):
    good = json.dumps({"prompt": "t5 t6", "response": "t7"}).encode()
    path = tmp_path / "data.jsonl"
    path.write_bytes(b"\n".join([good, good, line, good]) + b"\n")
    with pytest.raises(TrainingDataError) as error:
        read_records(path)
    message = str(error.value)
    assert message.startswith(f"Invalid training data: {path}:3: ") and expected in message, message
    assert "\n" not in message and error.value.total == 1


def test_every_bad_line_is_checked_and_the_first_ten_are_listed(tmp_path):
    good = json.dumps({"prompt": "t5", "response": "t6"}).encode()
    lines = []
    for line, _ in BAD_LINES:
        lines += [good, line]
    path = tmp_path / "data.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(TrainingDataError) as error:
        read_records(path)
    assert error.value.total == len(BAD_LINES) and len(error.value.problems) == 10
    message = str(error.value)
    assert message.startswith(f"Invalid training data in {path}: {len(BAD_LINES)} bad records")
    for number, (_, expected) in zip(range(2, 21, 2), BAD_LINES, strict=False):
        assert f"{path}:{number}: " in message and expected in message
    assert f"... and {len(BAD_LINES) - 10} more" in message


def test_in_memory_records_and_json_arrays_name_the_bad_record(tmp_path):
    with pytest.raises(TrainingDataError, match=r"records\[2\]: is null, not an object"):
        read_records([{"prompt": "t5", "response": "t6"}] * 2 + [None])
    path = tmp_path / "data.json"
    path.write_text(json.dumps([{"prompt": "t5", "response": "t6"}, {"prompt": "t5", "response": 7}]))
    with pytest.raises(TrainingDataError, match=r"data.json\[1\]: 'response' is a number"):
        read_records(path)


@pytest.mark.parametrize("content", ["", "\n \n\n"])
def test_an_empty_file_is_refused(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(TrainingDataError, match="empty.jsonl holds no records"):
        read_records(path)
    with pytest.raises(TrainingDataError, match="holds no records"):
        read_records([])


def test_valid_lines_that_the_old_reader_broke_are_read(tmp_path):
    """A BOM, CRLF line ends, U+2028 inside a string (not a line end in JSON), and the None columns `datasets` gives."""
    path = tmp_path / "data.jsonl"
    rows = [{"prompt": "t5\u2028t6", "response": "t7"}, {"prompt": "t8", "response": "t9", "messages": None}]
    path.write_bytes(b"\xef\xbb\xbf" + b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\r\n" for r in rows))
    found = read_records(path)
    assert found.records == rows and found.locations == [f"{path}:1", f"{path}:2"]


def test_token_ids_outside_the_vocabulary_stop_the_run_before_it_trains(backbone, tmp_path):
    records = id_records(60)
    records[36]["response_ids"][2] = VOCAB  # line 37
    records[50]["prompt_ids"][0] = VOCAB + 1000  # line 51
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    steps, count = steps_counter()
    with pytest.raises(TrainingDataError) as error:
        train_head(str(backbone), str(data), tmp_path / "out", config=config(), on_step_end=count)
    message = str(error.value)
    assert f"{data}:37: 'response_ids'[2] is token id {VOCAB}, outside the backbone's vocabulary (ids 0..{VOCAB - 1})" in message
    assert f"{data}:51: 'prompt_ids'[0] is token id {VOCAB + 1000}" in message and error.value.total == 2
    assert steps == [] and not (tmp_path / "out").exists()  # nothing trained, nothing written


def test_a_held_out_file_is_checked_too(backbone, tmp_path):
    bad = tmp_path / "eval.jsonl"
    bad.write_text(json.dumps({"prompt_ids": [5], "response_ids": [VOCAB]}) + "\n")
    with pytest.raises(TrainingDataError, match=r"eval.jsonl:1: 'response_ids'\[0\] is token id 128"):
        train_head(str(backbone), RECORDS, tmp_path / "out", config=config(), eval_dataset=str(bad))


def test_cli_reports_bad_data_in_one_message_without_a_traceback(backbone, tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    data.write_bytes(b'{"prompt_ids": [5], "response_ids": [6]}\nnull\n')
    code = cli_main(["train", "--backbone", str(backbone), "--trust-remote-code", "--dataset", str(data),
                     "--output", str(tmp_path / "out"), "--steps", "2", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and f"mrp-hf train: error: Invalid training data: {data}:2: is null, not an object" in err
    assert "Traceback" not in err


# ------------------------------------------------------------------------------------------ output folder
def test_a_new_run_refuses_a_folder_holding_a_checkpoint(backbone, straight, tmp_path):
    out = tmp_path / "run"
    stop_at(backbone, out, 2)
    before = {p.name: p.read_bytes() for p in (out / "checkpoint").iterdir()}
    steps, count = steps_counter()
    with pytest.raises(OutputExistsError) as error:
        train_head(str(backbone), RECORDS, out, config=config(), on_step_end=count)
    message = str(error.value)
    assert f"{out} already holds a training checkpoint (step 2 of 6)" in message
    assert "--resume" in message and "--overwrite" in message
    assert steps == [] and {p.name: p.read_bytes() for p in (out / "checkpoint").iterdir()} == before
    # --overwrite deletes nothing when the run fails before training (here: on its data) ...
    with pytest.raises(TrainingDataError):
        train_head(str(backbone), [*RECORDS, {"prompt_ids": [5], "response_ids": [VOCAB]}], out, config=config(overwrite=True))
    assert {p.name: p.read_bytes() for p in (out / "checkpoint").iterdir()} == before
    # ... and otherwise deletes the checkpoint and starts over: the same head as a straight run
    head = train_head(str(backbone), RECORDS, out, config=config(overwrite=True), on_step_end=count)
    assert steps == [1, 2, 3, 4, 5, 6]
    assert_same_weights(head, straight)
    assert sorted(p.name for p in out.iterdir()) == HEAD_FOLDER


def test_a_new_run_refuses_a_finished_head_and_other_files(backbone, tmp_path, capsys):
    out = tmp_path / "run"
    train_head(str(backbone), RECORDS, out, config=config(max_steps=2))
    with pytest.raises(OutputExistsError, match=r"already holds a trained head \(a finished run of 2 steps\).*--overwrite"):
        train_head(str(backbone), RECORDS, out, config=config(max_steps=2))
    code = cli_main(["train", "--backbone", str(backbone), "--trust-remote-code", "--dataset", str(tmp_path / "x.jsonl"),
                     "--output", str(out), "--steps", "2", "--no-progress"])
    assert code == 2 and "already holds a trained head" in capsys.readouterr().err
    # a folder with someone else's config.json / weights
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(OutputExistsError, match="already holds config.json, which the trained head would overwrite"):
        train_head(str(backbone), RECORDS, other, config=config(max_steps=2))
    with pytest.raises(OutputExistsError, match="already holds config.json"):
        train_head(str(backbone), RECORDS, other, config=config(max_steps=2, resume=True))
    # the backbone's own folder is never an output folder, even with overwrite
    with pytest.raises(ValueError, match="is the backbone's own folder"):
        train_head(str(backbone), RECORDS, backbone, config=config(max_steps=2, overwrite=True))
    assert (backbone / "config.json").is_file()


def test_resume_and_overwrite_exclude_each_other(capsys):
    from mrp_hf.train import parse_train_args

    with pytest.raises(ValueError, match="contradict"):
        MRPTrainingConfig(resume=True, overwrite=True)
    with pytest.raises(SystemExit) as raised:
        parse_train_args(["--backbone", "b", "--dataset", "d", "--output", "o", "--resume", "--overwrite"])
    assert raised.value.code == 2 and "resume=True and overwrite=True contradict" in capsys.readouterr().err
    assert parse_train_args(["--backbone", "b", "--dataset", "d", "--output", "o", "--overwrite"])[1].overwrite is True


@pytest.mark.parametrize("keep_checkpoint", [False, True])
def test_resume_on_a_finished_run_trains_nothing_and_says_so(backbone, straight, tmp_path, keep_checkpoint, capsys, caplog):
    out = tmp_path / "run"
    train_head(str(backbone), RECORDS, out, config=config(keep_checkpoint=keep_checkpoint))
    weights = (out / "model.safetensors").read_bytes()
    steps, count = steps_counter()
    head = train_head(str(backbone), RECORDS, out, config=config(resume=True), on_step_end=count)
    assert steps == [] and (out / "model.safetensors").read_bytes() == weights
    assert_same_weights(head, straight)
    assert head.config.training["steps"] == 6
    # the CLI: one line naming the folder and the step, exit 0
    code = cli_main(["train", "--backbone", str(backbone), "--trust-remote-code", "--dataset", str(tmp_path / "unused.jsonl"),
                     "--output", str(out), "--steps", "6", "--resume", "--no-progress"])
    # (the CLI's stderr handler is installed once per process: read the record, not this test's stderr)
    assert code == 0 and f"{out} holds a finished run (its trained head, step 6): nothing to resume" in caplog.text
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"] == 6


def test_resuming_with_another_number_of_processes_is_refused(backbone, tmp_path):
    out = tmp_path / "run"
    stop_at(backbone, out, 2)
    checkpoint = out / "checkpoint"
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    state["num_processes"] = 2  # as if two processes had written it
    (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    for name in ("random_states_{}.pkl", "data_rng_state_{}.pt"):
        shutil.copy(checkpoint / name.format(0), checkpoint / name.format(1))
    with pytest.raises(ValueError, match="written by 2 processes and 1 are resuming it.*Resume with 2 processes"):
        train_head(str(backbone), RECORDS, out, config=config(resume=True))


# ------------------------------------------------------------------------------------------ full disks
TORCH_ENOSPC = "[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"
Usage = namedtuple("Usage", "total used free")


def fail_on_write(monkeypatch, module_attr, file_name, error, nth=1, free=4096):
    """Make the nth write of `file_name` through `module_attr` (torch.save, or the safetensors writer that
    accelerate's `save_state` uses) write part of the file, then raise `error`; the disk reports `free` bytes free."""
    real = getattr(*module_attr)
    calls = []

    def write(obj, target, *args, **kwargs):
        if Path(target).name == file_name:
            calls.append(target)
            if len(calls) == nth:
                Path(target).write_bytes(b"\0" * 1000)
                raise error
        return real(obj, target, *args, **kwargs)

    monkeypatch.setattr(*module_attr, write)
    if free is not None:
        monkeypatch.setattr(checkpoint_module.shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - free, free))
    return calls


WRITE_FAILURES = {
    "torch-enforce-fail": ((torch, "save"), "optimizer.bin", RuntimeError(TORCH_ENOSPC)),
    "enospc": ((accelerate_io, "safe_save_file"), "model.safetensors", OSError(errno.ENOSPC, "No space left on device")),
    "safetensors": (
        (accelerate_io, "safe_save_file"), "model.safetensors",
        SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
    ),
}


@pytest.mark.parametrize("failure", list(WRITE_FAILURES))
def test_a_full_disk_while_checkpointing_keeps_the_previous_checkpoint(backbone, straight, tmp_path, monkeypatch, failure):
    module_attr, file_name, error = WRITE_FAILURES[failure]
    out = tmp_path / "run"
    fail_on_write(monkeypatch, module_attr, file_name, error, nth=2)  # the checkpoint at step 4
    with pytest.raises(NoSpaceLeftError) as raised:
        train_head(str(backbone), RECORDS, out, config=config())
    message = str(raised.value)
    assert message.startswith(f"No space left on device while writing the checkpoint to {out}: it needs about ")
    assert "4.0 KiB free now" in message and f"the previous checkpoint {out / 'checkpoint'} (step 2) is intact" in message
    assert "--resume" in message and raised.value.errno == errno.ENOSPC and raised.value.needed_bytes > 150_000
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint"]  # no .checkpoint-tmp, no .checkpoint-old
    assert checkpoint_step(out) == 2
    monkeypatch.undo()
    assert_same_weights(train_head(str(backbone), RECORDS, out, config=config(resume=True)), straight)


def test_a_write_failure_with_free_space_is_not_called_a_full_disk(backbone, tmp_path, monkeypatch):
    out = tmp_path / "run"
    fail_on_write(monkeypatch, (torch, "save"), "optimizer.bin", RuntimeError(TORCH_ENOSPC), nth=2, free=10**9)
    with pytest.raises(RuntimeError, match="inline_container") as raised:
        train_head(str(backbone), RECORDS, out, config=config())
    assert not isinstance(raised.value, NoSpaceLeftError)
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint"] and checkpoint_step(out) == 2


def test_a_full_disk_while_saving_the_head_loses_no_step(backbone, straight, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    real = MRPHead.save_pretrained

    def save_part_then_fail(self, folder, *args, **kwargs):
        (Path(folder) / "config.json").write_text("{}")
        (Path(folder) / "model.safetensors").write_bytes(b"\0" * 100)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(MRPHead, "save_pretrained", save_part_then_fail)
    monkeypatch.setattr(checkpoint_module.shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 512, 512))
    code = cli_main(["train", "--backbone", str(backbone), "--trust-remote-code", "--dataset", str(write_records(tmp_path)),
                     "--output", str(out), "--steps", "6", "--batch-size", "8", "--max-length", "32", "--num-layers", "1",
                     "--save-every", "2", "--eval-every", "3", "--eval-fraction", "0.1", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1 and f"mrp-hf train: error: No space left on device while writing the trained head to {out}" in err
    assert f"nothing is lost: the checkpoint {out / 'checkpoint'} (step 6) holds the trained state" in err
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint"]  # no half-written head, no .head-tmp
    monkeypatch.setattr(MRPHead, "save_pretrained", real)
    steps, count = steps_counter()
    head = train_head(str(backbone), str(write_records(tmp_path)), out, config=config(resume=True), on_step_end=count)
    assert steps == []  # the head is written from the final checkpoint, nothing is retrained
    assert_same_weights(head, straight)
    assert sorted(p.name for p in out.iterdir()) == HEAD_FOLDER


def write_records(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return path


# ------------------------------------------------------------------------------------------ crashes
class Killed(BaseException):
    """Stands for kill -9: nothing after it runs."""


def test_a_half_deleted_checkpoint_is_never_loaded(backbone, tmp_path):
    out = tmp_path / "run"
    stop_at(backbone, out, 2)
    os.replace(out / "checkpoint", out / ".checkpoint-old")  # a swap that stopped between its renames
    assert find_checkpoint(out) == out / ".checkpoint-old"
    (out / ".checkpoint-old" / "optimizer.bin").unlink()  # ... and a deletion that stopped half-way
    assert find_checkpoint(out) is None


def test_a_crash_while_deleting_the_old_checkpoint_loses_no_step(backbone, straight, tmp_path, monkeypatch):
    """A swap interrupted between its renames leaves only `.checkpoint-old`; the next save must not delete that
    only complete checkpoint before the new one is in place."""
    out = tmp_path / "run"
    stop_at(backbone, out, 2)
    os.replace(out / "checkpoint", out / ".checkpoint-old")
    real_rmtree = shutil.rmtree

    def rmtree_then_die(path, *args, **kwargs):
        path = Path(path)
        if path.name == ".checkpoint-old" and path.exists():
            (path / "model.safetensors").unlink()
            raise Killed
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module.shutil, "rmtree", rmtree_then_die)
    with pytest.raises(Killed):
        train_head(str(backbone), RECORDS, out, config=config(resume=True))
    monkeypatch.undo()
    assert checkpoint_step(out) == 4  # the new checkpoint is in place; the half-deleted one is ignored
    assert_same_weights(train_head(str(backbone), RECORDS, out, config=config(resume=True)), straight)


# ------------------------------------------------------------------------------------------ slow: real disks, real kills
@pytest.fixture
def small_tmpfs(tmp_path):
    """A 320 KiB tmpfs: room for one checkpoint of the tiny head (about 180 KiB), not for two."""
    mount = tmp_path / "small"
    mount.mkdir()
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=320k", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield mount
    gc.collect()  # tensors loaded with safetensors may still map files of the mount
    if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "--lazy", str(mount)], check=True)


@pytest.mark.slow
def test_a_real_full_disk_keeps_the_previous_checkpoint_and_resume_finishes(backbone, straight, small_tmpfs):
    out = small_tmpfs / "run"
    with pytest.raises(NoSpaceLeftError) as raised:
        train_head(str(backbone), RECORDS, out, config=config())
    message = str(raised.value)
    assert message.startswith(f"No space left on device while writing the checkpoint to {out}: it needs about ")
    assert "(step 2) is intact" in message, message
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint"] and checkpoint_step(out) == 2
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_tmpfs)], check=True)  # "free some space"
    assert_same_weights(train_head(str(backbone), RECORDS, out, config=config(resume=True)), straight)


@pytest.mark.slow
def test_kill_9_at_random_moments_then_resume_matches_uninterrupted(backbone, tmp_path):
    """`mrp-hf train` killed with SIGKILL at random moments after its checkpoints appear (during steps, writes and
    swaps); each time the checkpoint is complete and no older than before, and resuming to the end gives the
    uninterrupted run's head."""
    data = write_records(tmp_path)
    flags = ["train", "--backbone", str(backbone), "--trust-remote-code", "--dataset", str(data), "--steps", "200",
             "--batch-size", "4", "--max-length", "32", "--num-layers", "1", "--save-every", "1", "--eval-every", "0",
             "--eval-fraction", "0.1", "--no-progress", "--seed", "3"]
    assert cli_main(flags + ["--output", str(tmp_path / "straight")]) == 0
    out = tmp_path / "killed"
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(mrp_hf_src()), os.environ.get("PYTHONPATH")])))
    rng = random.Random(0)
    last = 0
    for attempt in range(4):
        extra = ["--resume"] if attempt else []
        log = tmp_path / f"attempt{attempt}.log"
        with open(log, "w") as handle:
            process = subprocess.Popen([sys.executable, "-m", "mrp_hf.cli", *flags, "--output", str(out), *extra],
                                       env=env, stdout=handle, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while process.poll() is None and time.monotonic() < deadline and (checkpoint_step(out) or 0) <= last:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.4))
        if process.poll() is not None:
            pytest.fail(f"the run ended before it was killed (exit code {process.returncode}): {log.read_text()[-3000:]}")
        process.send_signal(signal.SIGKILL)
        process.wait()
        step = checkpoint_step(out)
        assert step is not None and step >= last, (attempt, step, last, sorted(p.name for p in out.iterdir()))
        last = step
    assert cli_main(flags + ["--output", str(out), "--resume"]) == 0
    a, b = (MRPHead.from_pretrained(str(tmp_path / name)) for name in ("straight", "killed"))
    assert_same_weights(b, a.state_dict())


def mrp_hf_src():
    import mrp_hf

    return Path(mrp_hf.__file__).parent.parent
