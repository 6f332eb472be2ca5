"""Run untrusted generated code (HumanEval completions) in separate, limited processes.

Each program runs in its own `python -I` process, in a fresh temporary directory that is also its HOME and
TMPDIR, with a minimal environment. Layers, from the operating system up (each is recorded per result in
`SandboxResult.protections`, because which ones are available depends on the machine):

- **process**: own session / process group, killed as a group on wall-clock timeout;
- **rlimits**: address space (RLIMIT_AS), CPU seconds (RLIMIT_CPU), file size (RLIMIT_FSIZE), open files,
  no core dumps, and no new processes (RLIMIT_NPROC = 0, which root ignores);
- **network namespace**: the child unshares its network namespace (only an unconfigured loopback is left),
  directly as root or inside a new user namespace otherwise, when the kernel allows it;
- **privilege drop**: when started as root, the child becomes `nobody` so file permissions apply to it;
- **Python guard**: a `sys.addaudithook` hook, installed before the program runs, refuses writes, deletes,
  renames, chmod/chown, links outside the sandbox directory, sockets, subprocesses, `os.system`/`exec*`/
  `fork`/`kill`, `ctypes` and imports of `_posixsubprocess`/`_ctypes`.

The Python guard is *not* a security boundary (audit hooks can be evaded by native code, and by a program
that works hard at it); the OS layers are the real barriers where they are active. Run evaluations of
models you do not trust inside a container or VM as well. See docs/evaluation.md.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_NOBODY = 65534
_warned_no_drop = False
_OUTPUT_TAIL = 4000  # characters of stdout/stderr kept per result


@dataclass(frozen=True)
class SandboxConfig:
    """Limits for one program. `timeout` is wall-clock seconds; CPU time is capped a little above it."""

    timeout: float = 5.0
    memory_mb: int = 1024
    file_size_mb: int = 16
    max_open_files: int = 64
    isolate_network: bool = True
    readonly_filesystem: bool = True
    drop_privileges: bool = True
    python_guard: bool = True
    base_dir: str | None = None  # parent of the per-program temporary directories (default: system temp)


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


# Runs first in the child, as `python -I -c PREAMBLE CONFIG_JSON`; reads the nonce from stdin, then the
# program from program.py, applies the limits, and runs the program. Kept free of f-strings' braces issues
# by being plain source.
_PREAMBLE = r'''
import json, os, sys
_cfg = json.loads(sys.argv[1])
_nonce = sys.stdin.readline().strip()
_root = _cfg["dir"]
_prot = {"process_group": True}

def _make_report(nonce):
    def report(kind, payload):
        sys.stdout.write(nonce + " " + kind + " " + json.dumps(payload) + "\n")
        sys.stdout.flush()
    return report

_r = _make_report(_nonce)
del _nonce, _make_report

import resource
_rl = {}
for _name, _value in (("RLIMIT_AS", _cfg["memory"]), ("RLIMIT_CPU", _cfg["cpu"]), ("RLIMIT_FSIZE", _cfg["fsize"]),
                      ("RLIMIT_NOFILE", _cfg["nofile"]), ("RLIMIT_CORE", 0)):
    try:
        resource.setrlimit(getattr(resource, _name), (_value, _value))
        _rl[_name] = _value
    except (ValueError, OSError, AttributeError) as _e:
        _rl[_name] = "unavailable: " + str(_e)
_prot["rlimits"] = _rl

_prot["network_namespace"] = False
_prot["readonly_filesystem"] = False
if (_cfg["isolate_network"] or _cfg["readonly_fs"]) and sys.platform.startswith("linux"):
    try:
        import ctypes
        _libc = ctypes.CDLL(None, use_errno=True)
        _CLONE_NEWNET, _CLONE_NEWNS, _CLONE_NEWUSER = 0x40000000, 0x00020000, 0x10000000
        _flags = (_CLONE_NEWNET if _cfg["isolate_network"] else 0) | (_CLONE_NEWNS if _cfg["readonly_fs"] else 0)
        if os.geteuid() != 0:  # unprivileged: a user namespace grants the capabilities inside it
            _flags |= _CLONE_NEWUSER
        if _libc.unshare(_flags) == 0:
            _prot["network_namespace"] = bool(_flags & _CLONE_NEWNET)
        else:
            _prot["namespace_error"] = os.strerror(ctypes.get_errno())
            _flags = 0
        if _flags & _CLONE_NEWNS:
            # every mount read-only except a bind mount of the sandbox directory (the real barrier for files)
            _MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
            _keep = 2 | 4 | 8 | 1024 | 2048 | (1 << 21)  # nosuid nodev noexec noatime nodiratime relatime
            _mount = _libc.mount
            _ok = _mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) == 0
            _ok = _ok and _mount(_root.encode(), _root.encode(), None, _MS_BIND, None) == 0
            _failed = []
            if _ok:
                with open("/proc/self/mountinfo", encoding="utf-8") as _f:
                    _points = [l.split()[4] for l in _f]
                _points = [p.encode().decode("unicode_escape") if "\\" in p else p for p in _points]
                for _p in dict.fromkeys(_points):
                    if _p == _root:
                        continue
                    try:
                        _fl = os.statvfs(_p).f_flag & _keep
                    except OSError:
                        continue
                    if _mount(None, _p.encode(), None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _fl, None) != 0:
                        _failed.append(_p)
            _prot["readonly_filesystem"] = _ok and "/" not in _failed and not os.access("/", os.W_OK)
            if _failed:
                _prot["readonly_failed_mounts"] = _failed[:20]
        del ctypes, _libc
    except Exception as _e:
        _prot["namespace_error"] = repr(_e)
    for _m in [m for m in sys.modules if m == "ctypes" or m.startswith("ctypes.") or m == "_ctypes"]:
        del sys.modules[_m]

_prot["dropped_privileges"] = False
if _cfg["drop_uid"] is not None and os.geteuid() == 0:
    try:
        os.setgroups([])
        os.setgid(_cfg["drop_uid"])
        os.setuid(_cfg["drop_uid"])
        _prot["dropped_privileges"] = True
    except OSError as _e:
        _prot["dropped_privileges_error"] = repr(_e)
try:  # no new processes; root ignores RLIMIT_NPROC, hence after the privilege drop
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    _rl["RLIMIT_NPROC"] = 0 if os.geteuid() != 0 else "ignored for root"
except (ValueError, OSError) as _e:
    _rl["RLIMIT_NPROC"] = "unavailable: " + str(_e)

os.chdir(_root)
with open(os.path.join(_root, "program.py"), encoding="utf-8") as _f:
    _source = _f.read()

def _install_guard(root):
    import builtins
    _real = os.path.realpath
    _inside_root = root.rstrip(os.sep) + os.sep
    _busy = [False]
    _write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    _path_events = {
        "os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.chmod": 1, "os.chown": 1, "os.truncate": 1,
        "os.utime": 1, "os.chflags": 1, "os.lchflags": 1, "os.setxattr": 1, "os.removexattr": 1,
        "os.rename": 2, "os.link": 2, "os.symlink": 2, "shutil.rmtree": 1, "shutil.copyfile": 2,
        "shutil.copytree": 2, "shutil.chown": 1, "os.mkfifo": 1, "os.mknod": 1,
    }
    _denied = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
               "os.forkpty", "os.kill", "os.killpg", "pty.", "ctypes.", "os.startfile", "webbrowser.",
               "urllib.Request", "ftplib.", "smtplib.", "http.client.", "os.chroot", "os.setuid")
    _denied_imports = {"_posixsubprocess", "_ctypes", "ctypes"}

    def _inside(path):
        if isinstance(path, int):  # an fd: opened earlier through a checked call
            return True
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        full = _real(os.path.join(os.getcwd(), os.fspath(path)))
        return full == root or full.startswith(_inside_root)

    def hook(event, args):
        if _busy[0]:
            return
        _busy[0] = True
        try:
            if event == "open":
                path, mode, flags = (tuple(args) + (None, None))[:3]
                writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                    isinstance(flags, int) and flags & _write_flags)
                if writing and path is not None and not _inside(path):
                    raise PermissionError("sandbox: writing outside the sandbox directory: " + repr(path))
            elif event in _path_events:
                for path in list(args)[: _path_events[event]]:
                    if path is not None and not _inside(path):
                        raise PermissionError("sandbox: " + event + " outside the sandbox directory: " + repr(path))
            elif event.startswith(_denied):
                raise PermissionError("sandbox: " + event + " is not allowed")
            elif event == "import" and args and str(args[0]).split(".")[0] in _denied_imports:
                raise PermissionError("sandbox: importing " + str(args[0]) + " is not allowed")
        finally:
            _busy[0] = False

    sys.addaudithook(hook)
    return True

_prot["python_guard"] = bool(_cfg["python_guard"]) and _install_guard(_root)
_r("protections", _prot)
del _cfg, _prot, _rl, _install_guard


def _main(code, report):
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(code, scope)
    except SystemExit as exc:  # a program that exits early did not finish its checks
        sys.stderr.write("SystemExit: the program called exit(" + repr(exc.code) + ") before finishing\n")
        sys.stderr.flush()
        os._exit(1)
    report("done", {})


_c = compile(_source, "program.py", "exec")
del _source
_main(globals().pop("_c"), globals().pop("_r"))
'''


def _world_traversable(path: str) -> bool:
    """True when `nobody` can reach `path` (every directory above it has o+x)."""
    current = Path(path).resolve()
    for part in [current, *current.parents]:
        try:
            mode = part.stat().st_mode
        except OSError:
            return False
        if not mode & stat.S_IXOTH:
            return False
    return True


def _drop_uid(config: SandboxConfig, base: str) -> int | None:
    """Drop to `nobody` only when we are root and the interpreter and the base dir stay reachable."""
    if not config.drop_privileges or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    needed = [base, sys.prefix, sys.base_prefix, sysconfig.get_paths()["stdlib"]]
    if all(_world_traversable(p) for p in needed):
        return _NOBODY
    global _warned_no_drop
    if not _warned_no_drop:  # once per process: the reason does not change between programs
        _warned_no_drop = True
        logger.info("sandbox: running as root without dropping to nobody: the interpreter or %s is not reachable "
                    "by nobody (the read-only mount namespace still protects files where available)", base)
    return None


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 4 * _OUTPUT_TAIL))
            return handle.read().decode("utf-8", "replace")[-_OUTPUT_TAIL:]
    except OSError:
        return ""


def _classify(returncode: int | None, timed_out: bool, stderr: str, finished: bool) -> str:
    if timed_out:
        return "timeout"
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    if returncode is not None and returncode < 0:
        sig = -returncode
        if sig == getattr(signal, "SIGXCPU", -1):
            return "timeout"
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        return f"error: killed by {name}"
    if "MemoryError" in last or last.startswith("MemoryError"):
        return "memory"
    if returncode == 0 and finished:
        return "passed"
    if returncode == 0:
        return "error: exited without finishing"
    return f"error: {last[:300]}" if last else f"error: exit code {returncode}"


def run_program(source: str, config: SandboxConfig | None = None) -> SandboxResult:
    """Run one program (Python source) in a fresh sandbox; never raises for anything the program does."""
    config = config or SandboxConfig()
    base = config.base_dir or tempfile.gettempdir()
    drop_uid = _drop_uid(config, base)
    workdir = tempfile.mkdtemp(prefix="mrp-sandbox-", dir=base)
    outdir = tempfile.mkdtemp(prefix="mrp-sandbox-out-", dir=base)  # outside the program's reach
    start = time.perf_counter()
    proc = None
    try:
        root = os.path.realpath(workdir)
        Path(root, "program.py").write_text(source, encoding="utf-8")
        if drop_uid is not None:
            os.chown(root, drop_uid, drop_uid)
            os.chown(Path(root, "program.py"), drop_uid, drop_uid)
        nonce = secrets.token_hex(16)
        child_config = {
            "dir": root,
            "memory": int(config.memory_mb) * 1024 * 1024,
            "cpu": max(1, int(config.timeout) + 1),
            "fsize": int(config.file_size_mb) * 1024 * 1024,
            "nofile": int(config.max_open_files),
            "isolate_network": config.isolate_network,
            "readonly_fs": config.readonly_filesystem,
            "drop_uid": drop_uid,
            "python_guard": config.python_guard,
        }
        env = {"HOME": root, "TMPDIR": root, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
               "PYTHONDONTWRITEBYTECODE": "1"}
        out_path, err_path = Path(outdir, "stdout"), Path(outdir, "stderr")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _PREAMBLE, json.dumps(child_config)],
                stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=root, env=env,
                start_new_session=True, close_fds=True,
            )
            try:
                proc.stdin.write((nonce + "\n").encode())
                proc.stdin.close()
            except OSError:
                pass
            timed_out = False
            try:
                proc.wait(timeout=config.timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            _kill_group(proc)
        stdout, stderr = _tail(out_path), _tail(err_path)
        protections: dict[str, Any] = {}
        finished = False
        for line in stdout.splitlines():
            if line.startswith(nonce + " "):
                _, kind, payload = line.split(" ", 2)
                if kind == "protections":
                    protections = json.loads(payload)
                elif kind == "done":
                    finished = True
        stdout = "\n".join(line for line in stdout.splitlines() if not line.startswith(nonce))
        reason = _classify(proc.returncode, timed_out, stderr, finished)
        return SandboxResult(reason == "passed", reason, time.perf_counter() - start, proc.returncode, stdout, stderr,
                             protections)
    except Exception as exc:  # the harness itself failed (e.g. no disk space): a failed sample, not a crash
        logger.warning("sandbox: could not run a program: %r", exc)
        if proc is not None:
            _kill_group(proc)
        return SandboxResult(False, f"error: sandbox failure: {exc!r}", time.perf_counter() - start, None)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(outdir, ignore_errors=True)


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the program's whole process group (it may have started children) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        logger.warning("sandbox: process %d did not die after SIGKILL", proc.pid)


def run_programs(
    sources: Sequence[str] | Iterable[str], config: SandboxConfig | None = None, workers: int = 2
) -> list[SandboxResult]:
    """Run many programs, `workers` at a time (threads that each wait on a child process); order kept."""
    sources = list(sources)
    if workers <= 1 or len(sources) <= 1:
        return [run_program(s, config) for s in sources]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda s: run_program(s, config), sources))
