"""Head training under an `accelerate` FSDP config: 2 CPU processes (gloo), compared with 2-process DDP.

`accelerate` enables FSDP on GPUs / accelerators only: with `--cpu` (and ACCELERATE_USE_CPU=true) an FSDP
config runs as plain multi-CPU DDP. To run the real FSDP code paths (accelerate's FSDP `prepare`, torch
FSDP1 / FSDP2 collectives, the trainer's backbone sharding and full-state checkpoints) on CPU, the launched
script below switches accelerate's state to FSDP after it is built, then runs `mrp_hf.train` unchanged.
On GPUs the same config runs as `accelerate launch --config_file fsdp.yaml -m mrp_hf.train ...`.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file
from stand_ins import save_stand_in
from test_training import synthetic_records, write_jsonl

from mrp_hf import MRPHead

FORCE_FSDP_ON_CPU = '''
import sys

import torch
from accelerate import PartialState
from accelerate.state import AcceleratorState
from accelerate.utils import DistributedType

_init = AcceleratorState.__init__
_plugin = []


def _init_fsdp_on_cpu(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    if kwargs.get("fsdp_plugin") is not None:
        _plugin[:] = [kwargs["fsdp_plugin"]]
    if _plugin and self.distributed_type == DistributedType.MULTI_CPU:
        self.distributed_type = DistributedType.FSDP
        self.fsdp_plugin = _plugin[0]
        # accelerate gives CPU processes the device "cpu:0", which FSDP1 rejects next to "cpu" parameters
        PartialState._shared_state["device"] = self.device = torch.device("cpu")


AcceleratorState.__init__ = _init_fsdp_on_cpu
from mrp_hf.train import main  # noqa: E402

sys.exit(main())
'''


def fsdp_config(version, wrap="TRANSFORMER_BASED_WRAP"):
    lines = f"""
        compute_environment: LOCAL_MACHINE
        distributed_type: FSDP
        num_processes: 2
        num_machines: 1
        machine_rank: 0
        mixed_precision: 'no'
        use_cpu: true
        fsdp_config:
          fsdp_version: {version}
          fsdp_auto_wrap_policy: {wrap}
          fsdp_transformer_layer_cls_to_wrap: SDARDecoderLayer
          fsdp_state_dict_type: FULL_STATE_DICT
          fsdp_offload_params: false
          fsdp_cpu_ram_efficient_loading: false
    """
    lines = textwrap.dedent(lines)  # keys of fsdp_config below are indented by 2, as in the text above
    if version == 1:  # sync_module_states needs a GPU in accelerate's plugin
        lines += "  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_sync_module_states: false\n  fsdp_use_orig_params: true\n"
    else:
        lines += "  fsdp_reshard_after_forward: true\n"
    return lines


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp")
    backbone = save_stand_in("sdar", root / "sdar")
    data = write_jsonl(root / "data.jsonl", synthetic_records(180))  # 9 held-out rows: uneven over 2 processes
    (root / "force_fsdp.py").write_text(FORCE_FSDP_ON_CPU)
    for version in (1, 2):
        (root / f"fsdp{version}.yaml").write_text(fsdp_config(version))
    return root, backbone, data


def train_args(backbone, data, output, *extra):
    return [
        "--backbone", str(backbone), "--trust-remote-code", "--dataset", str(data), "--output", str(output),
        "--batch-size", "4", "--eval-batch-size", "2", "--max-length", "32", "--num-layers", "1", "--block-length", "4",
        "--k-steps", "2", "--eval-every", "2", "--save-every", "2", "--no-progress", *extra,
    ]


ENV = dict(os.environ, ACCELERATE_USE_CPU="true", OMP_NUM_THREADS="1")


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(command, timeout=180):
    """Run a launcher in its own process group, so that a timeout also ends the workers it started."""
    process = subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"{command[2]} timed out after {timeout} s: {err[-3000:]}")
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def launch_fsdp(root, version, args):
    return run([
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(root / f"fsdp{version}.yaml"),
        "--main_process_port", str(free_port()), str(root / "force_fsdp.py"), *args,
    ])


def launch_ddp(args):
    return run([
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
        "-m", "mrp_hf.train", *args,
    ])


def assert_same_weights(a, b):
    first, second = (load_file(str(p / "model.safetensors")) for p in (a, b))
    assert sorted(first) == sorted(second)
    for name in first:
        assert torch.equal(first[name], second[name]), name


@pytest.mark.slow
def test_fsdp2_two_cpu_processes_shard_the_backbone_and_match_ddp(setup):
    """FSDP2 (head wrapped by accelerate, backbone layers sharded by the trainer) gives bitwise the weights of
    2-process DDP on CPU; the checkpoint holds the full head and optimizer state; the head loads normally."""
    root, backbone, data = setup
    fsdp = launch_fsdp(root, 2, train_args(backbone, data, root / "fsdp2", "--steps", "4", "--keep-checkpoint"))
    assert fsdp.returncode == 0, fsdp.stderr[-4000:]
    ddp = launch_ddp(train_args(backbone, data, root / "ddp", "--steps", "4"))
    assert ddp.returncode == 0, ddp.stderr[-4000:]
    assert_same_weights(root / "fsdp2", root / "ddp")

    training = json.loads((root / "fsdp2" / "config.json").read_text())["training"]
    assert training["distributed"] == {"type": "FSDP", "num_processes": 2, "fsdp_version": 2, "backbone_sharded_layers": 2}
    ddp_training = json.loads((root / "ddp" / "config.json").read_text())["training"]
    assert training["metrics"] == ddp_training["metrics"] and training["metrics"]["positions"] > 0
    head = MRPHead.from_pretrained(root / "fsdp2")
    saved = load_file(str(root / "fsdp2" / "model.safetensors"))
    assert set(saved) == set(head.state_dict()) and all(torch.equal(head.state_dict()[k], v) for k, v in saved.items())
    checkpoint = root / "fsdp2" / "checkpoint"
    assert sorted(p.name for p in checkpoint.iterdir()) == [
        "data_rng_state_0.pt", "data_rng_state_1.pt", "head.safetensors", "optimizer.pt", "random_states_0.pkl",
        "random_states_1.pkl", "scheduler.bin", "trainer_state.json",
    ]
    assert json.loads((checkpoint / "trainer_state.json").read_text())["state_format"] == "fsdp"
    assert set(load_file(str(checkpoint / "head.safetensors"))) == set(saved)  # full tensors, not shards
    optimizer = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    assert set(optimizer["state"]) == {f"head.{name}" for name in saved}  # keyed by name (in the chain), all of them
    for name, value in saved.items():
        assert optimizer["state"][f"head.{name}"]["exp_avg"].shape == value.shape


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 2])
def test_fsdp_resume_matches_uninterrupted(setup, version):
    """FSDP1 / FSDP2: checkpoint after 3 steps, resume, and get bitwise the weights of an uninterrupted run."""
    root, backbone, data = setup
    straight = launch_fsdp(root, version, train_args(backbone, data, root / f"a{version}", "--steps", "6"))
    assert straight.returncode == 0, straight.stderr[-4000:]
    stopped = launch_fsdp(root, version, train_args(backbone, data, root / f"b{version}", "--steps", "6", "--stop-after", "3"))
    assert stopped.returncode != 0 and (root / f"b{version}" / "checkpoint" / "trainer_state.json").is_file()
    resumed = launch_fsdp(root, version, train_args(backbone, data, root / f"b{version}", "--steps", "6", "--resume"))
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "Resumed from" in resumed.stderr
    assert_same_weights(root / f"a{version}", root / f"b{version}")
    training = json.loads((root / f"a{version}" / "config.json").read_text())["training"]
    assert training["distributed"]["fsdp_version"] == version and training["distributed"]["backbone_sharded_layers"] == 2
