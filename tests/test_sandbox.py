"""The sandbox for generated code: every misbehaviour is a failed sample with a reason, never a crash."""

import socket
from pathlib import Path

import pytest

from mrp_hf.evaluation.sandbox import SandboxConfig, run_program, run_programs

REPO = Path(__file__).resolve().parents[1]
FAST = SandboxConfig(timeout=2.0, memory_mb=512)


def test_a_correct_program_passes_and_reports_its_protections():
    result = run_program("def f(x):\n    return x + 1\nassert f(1) == 2\nprint('ok')\n", FAST)
    assert result.passed and result.reason == "passed"
    assert "ok" in result.stdout
    prot = result.protections
    assert prot["python_guard"] is True and prot["rlimits"]["RLIMIT_AS"] == 512 * 1024 * 1024
    assert {"network_namespace", "readonly_filesystem", "dropped_privileges"} <= set(prot)


def test_infinite_loop_is_a_timeout():
    result = run_program("while True:\n    pass\n", SandboxConfig(timeout=1.0))
    assert not result.passed and result.reason == "timeout"
    assert result.seconds < 4


def test_huge_allocation_is_a_memory_failure():
    result = run_program("x = bytearray(50 * 1024 ** 3)\n", FAST)
    assert not result.passed and result.reason == "memory"


def test_raise_is_an_error_with_the_exception():
    result = run_program("raise ValueError('boom')\n", FAST)
    assert not result.passed and result.reason == "error: ValueError: boom"


def test_early_exit_is_not_a_pass():
    result = run_program("import sys\nsys.exit(0)\nassert False\n", FAST)
    assert not result.passed and "SystemExit" in result.reason


def _escape_program(targets, victim):
    lines = ["import os, shutil", "done = []"]
    for path in targets:
        lines += [f"try:\n    open({str(path)!r}, 'w').write('escaped')\n    done.append(1)\nexcept OSError:\n    pass"]
    lines += [f"try:\n    os.remove({str(victim)!r})\nexcept OSError:\n    pass"]
    lines += [f"try:\n    os.rename({str(victim)!r}, {str(victim) + '.moved'!r})\nexcept OSError:\n    pass"]
    lines += [f"try:\n    shutil.rmtree({str(victim.parent)!r})\nexcept OSError:\n    pass"]
    lines += ["open('inside.txt', 'w').write('fine')", "assert done, 'no write outside succeeded'"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("guard", [True, False], ids=["python_guard", "os_layers_only"])
def test_writing_outside_the_sandbox_dir_does_not_succeed(tmp_path, guard):
    victim = tmp_path / "keep.txt"
    victim.write_text("precious")
    targets = [tmp_path / "escaped.txt", REPO / "SANDBOX_ESCAPE_TEST.txt", Path.home() / "sandbox_escape_test.txt"]
    try:
        result = run_program(_escape_program(targets, victim), SandboxConfig(timeout=3.0, python_guard=guard))
        prot = result.protections
        if not guard and not (prot.get("readonly_filesystem") or prot.get("dropped_privileges")):
            pytest.skip(f"no OS-level file protection on this machine: {prot}")
        assert not result.passed and "no write outside succeeded" in result.reason
        assert victim.read_text() == "precious" and not Path(str(victim) + ".moved").exists()
        for path in targets:
            assert not path.exists(), path
    finally:
        for path in targets:
            path.unlink(missing_ok=True)


@pytest.mark.parametrize("guard", [True, False], ids=["python_guard", "os_layers_only"])
def test_network_attempt_fails_and_reaches_nothing(guard):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    program = (
        "import socket\n"
        f"s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "s.sendall(b'hello')\n"
    )
    try:
        result = run_program(program, SandboxConfig(timeout=3.0, python_guard=guard))
        if not guard and not result.protections.get("network_namespace"):
            pytest.skip(f"no network namespace on this machine: {result.protections}")
        assert not result.passed and result.reason.startswith("error:")
        with pytest.raises(OSError):  # nothing connected (socket.timeout is an OSError)
            server.accept()
    finally:
        server.close()


def test_subprocesses_are_refused():
    result = run_program("import subprocess\nsubprocess.run(['true'])\n", FAST)
    assert not result.passed and "not allowed" in result.reason


def test_cwd_and_home_are_the_fresh_temporary_dir():
    program = (
        "import os\n"
        "assert os.getcwd() == os.environ['HOME'] == os.environ['TMPDIR']\n"
        "assert sorted(os.listdir('.')) == ['program.py'], os.listdir('.')\n"
        "assert 'PYTHONPATH' not in os.environ\n"
        "open('scratch.txt', 'w').write('x'); os.remove('scratch.txt')\n"
    )
    assert run_program(program, FAST).reason == "passed"


def test_run_programs_keeps_order_and_isolates_failures():
    sources = ["assert True\n", "while True: pass\n", "raise KeyError(3)\n", "print(1)\n"]
    results = run_programs(sources, SandboxConfig(timeout=1.0), workers=2)
    assert [r.reason for r in results] == ["passed", "timeout", "error: KeyError: 3", "passed"]
