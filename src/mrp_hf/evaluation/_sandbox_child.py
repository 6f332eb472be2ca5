"""The trusted code that starts every sandboxed process (see `sandbox.py`); standard library only.

The evaluator runs this file's source as `python -I -S -B -c SOURCE CONFIG_JSON` inside the sandbox. It sets
the resource limits, reads the untrusted source from an inherited file descriptor, and then plays one role:

- "program": run a plain program; its verdict is its exit status (0 after the last line ran).
- "candidate": run untrusted code that defines a function, then serve calls of that function over two pipes,
  with plain data only (see `encode`/`decode`). It never decides a verdict.
- "checker": run trusted test code against a proxy that forwards each call to the candidate's sandbox and
  decodes only plain data back; write the verdict on a pipe that only the evaluator reads. The untrusted
  code never runs in this process, so it cannot reach the verdict.

Imported as a module (tests, `sandbox.py`), it only defines the codec and helpers.
"""

import builtins
import json
import os
import struct
import sys

# ------------------------------------------------------------------------------------------- the codec
# A value travels as JSON built from tagged lists, so that every type is explicit and nothing but these types
# can be rebuilt: None, bool, int, float (inf and nan included), str, bytes, list, tuple, dict, set, frozenset.
MAX_DEPTH = 64
MAX_MESSAGE = 64 * 1024 * 1024


class ProtocolError(Exception):
    """A message that is not well-formed plain data (or an unsupported type to send)."""


def _to_tree(value, depth):
    if depth > MAX_DEPTH:
        raise ProtocolError(f"value nested deeper than {MAX_DEPTH} levels")
    kind = type(value)  # exact types: a subclass could carry behaviour (e.g. an __eq__ that is always True)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return ["i", format(value, "x")]  # hex: no limit on the number of digits, unlike decimal
    if kind is float:
        return ["f", value.hex()]
    if kind is bytes:
        return ["y", value.hex()]
    if kind in (list, tuple, set, frozenset):
        tag = {list: "l", tuple: "t", set: "s", frozenset: "fs"}[kind]
        return [tag, [_to_tree(item, depth + 1) for item in value]]
    if kind is dict:
        return ["d", [[_to_tree(k, depth + 1), _to_tree(v, depth + 1)] for k, v in value.items()]]
    raise ProtocolError(f"unsupported type {kind.__name__} (only None, bool, int, float, str, bytes, list, tuple, "
                        "dict, set and frozenset can be passed)")


def _from_tree(tree, depth):
    if depth > MAX_DEPTH:
        raise ProtocolError(f"value nested deeper than {MAX_DEPTH} levels")
    if tree is None or type(tree) is bool or type(tree) is str:
        return tree
    if type(tree) is not list or not tree or type(tree[0]) is not str:
        raise ProtocolError(f"malformed value {str(tree)[:80]!r}")
    tag = tree[0]
    if len(tree) != 2:
        raise ProtocolError(f"malformed value {str(tree)[:80]!r}")
    body = tree[1]
    if tag in ("i", "f", "y"):
        if type(body) is not str:
            raise ProtocolError(f"malformed {tag!r} value")
        try:
            return int(body, 16) if tag == "i" else float.fromhex(body) if tag == "f" else bytes.fromhex(body)
        except ValueError:
            raise ProtocolError(f"malformed {tag!r} value {body[:80]!r}") from None
    if type(body) is not list:
        raise ProtocolError(f"malformed value {str(tree)[:80]!r}")
    if tag == "d":
        out = {}
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise ProtocolError("malformed dict entry")
            key = _from_tree(pair[0], depth + 1)
            try:
                out[key] = _from_tree(pair[1], depth + 1)
            except TypeError:
                raise ProtocolError(f"unhashable dict key of type {type(key).__name__}") from None
        return out
    items = [_from_tree(item, depth + 1) for item in body]
    try:
        if tag == "l":
            return items
        if tag == "t":
            return tuple(items)
        if tag == "s":
            return set(items)
        if tag == "fs":
            return frozenset(items)
    except TypeError:
        raise ProtocolError("unhashable set member") from None
    raise ProtocolError(f"unknown type tag {tag[:20]!r}")


def encode(value):
    """Plain data -> bytes (ASCII JSON). Raises ProtocolError for anything else."""
    return json.dumps(_to_tree(value, 0), separators=(",", ":")).encode("ascii")


def decode(data):
    """bytes -> plain data. Raises ProtocolError for anything that `encode` could not have written."""
    try:
        tree = json.loads(data.decode("ascii"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"not valid JSON: {str(exc)[:200]}") from None
    return _from_tree(tree, 0)


def _reject_constant(name):
    raise ValueError(f"{name} is not allowed")


def send(fd, message):
    """One message: a 4-byte big-endian length, then the encoded message."""
    send_encoded(fd, encode(message))


def send_encoded(fd, payload):
    data = struct.pack(">I", len(payload)) + payload
    while data:
        data = data[os.write(fd, data):]


def _read_exact(fd, size):
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(fd):
    """The next message, or None at end of file (the other side closed its end or died)."""
    header = _read_exact(fd, 4)
    if header is None:
        return None
    (size,) = struct.unpack(">I", header)
    if size > MAX_MESSAGE:
        raise ProtocolError(f"message of {size} bytes exceeds {MAX_MESSAGE}")
    data = _read_exact(fd, size)
    if data is None:
        raise ProtocolError("message cut short")
    return decode(data)


def _text(exc):
    """str(exc) as an exact str; the exception may be the untrusted code's, with a __str__ of its own."""
    try:
        text = str(exc)
        return str.__str__(text) if isinstance(text, str) else ""
    except BaseException:
        return "<unprintable>"


def describe(exc):
    """'TypeName: message' (first line, at most 300 characters), as the last line of a traceback reads."""
    lines = _text(exc).strip().splitlines()
    name = str.__str__(type(exc).__name__)
    return (f"{name}: {lines[0]}" if lines else name)[:300]


# --------------------------------------------------------------------------------- in the sandbox only
def _set_limits(cfg):
    """Lower soft and hard limits (they cannot be raised again). In the bubblewrap sandbox a limit that cannot
    be set stops the run before any untrusted code starts."""
    import resource

    limits = [("RLIMIT_AS", cfg["memory"]), ("RLIMIT_CPU", cfg["cpu"]), ("RLIMIT_FSIZE", cfg["fsize"]),
              ("RLIMIT_NOFILE", cfg["nofile"]), ("RLIMIT_CORE", 0), ("RLIMIT_NPROC", 0)]  # no new processes
    for name, value in limits:
        try:
            resource.setrlimit(getattr(resource, name), (value, value))
        except (ValueError, OSError, AttributeError) as exc:
            if cfg["strict_limits"]:
                sys.stderr.write(f"sandbox: cannot set {name}={value}: {exc}\n")
                sys.stderr.flush()
                os._exit(3)


def _read_source(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode("utf-8")


def _install_guard(root):
    """Defence in depth only (the sandbox is the barrier): an audit hook that turns the usual ways out into
    clean `PermissionError`s. Python code can find ways around it; the kernel's checks still apply then."""
    real = os.path.realpath
    inside_root = root.rstrip(os.sep) + os.sep
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    path_events = {
        "os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.chmod": 1, "os.chown": 1, "os.truncate": 1,
        "os.utime": 1, "os.chflags": 1, "os.lchflags": 1, "os.setxattr": 1, "os.removexattr": 1,
        "os.rename": 2, "os.link": 2, "os.symlink": 2, "shutil.rmtree": 1, "shutil.copyfile": 2,
        "shutil.copytree": 2, "shutil.chown": 1, "os.mkfifo": 1, "os.mknod": 1,
    }
    denied = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
              "os.forkpty", "os.kill", "os.killpg", "pty.", "ctypes.", "os.startfile", "webbrowser.",
              "urllib.Request", "ftplib.", "smtplib.", "http.client.", "os.chroot", "os.setuid", "os.setns",
              "os.unshare", "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.settrace",
              "sys.setprofile", "sys._current_frames")
    denied_imports = frozenset({"_posixsubprocess", "_ctypes", "ctypes"})

    def inside(path):
        if isinstance(path, int):  # an fd: opened earlier through a checked call
            return True
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        full = real(os.path.join(os.getcwd(), os.fspath(path)))
        return full == root or full.startswith(inside_root)

    def hook(event, args):
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None))[:3]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & write_flags)
            if writing and path is not None and not inside(path):
                raise PermissionError("sandbox: writing outside the sandbox directory: " + repr(path))
        elif event in path_events:
            for path in list(args)[: path_events[event]]:
                if path is not None and not inside(path):
                    raise PermissionError("sandbox: " + event + " outside the sandbox directory: " + repr(path))
        elif event.startswith(denied):
            raise PermissionError("sandbox: " + event + " is not allowed")
        elif event == "import" and args and str(args[0]).split(".")[0] in denied_imports:
            raise PermissionError("sandbox: importing " + str(args[0]) + " is not allowed")

    sys.addaudithook(hook)


def _fresh_scope():
    return {"__name__": "__main__", "__builtins__": builtins}


def _finish(code):
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)  # no atexit handlers: they could be the untrusted code's


def _run_program(cfg, source):
    code = compile(source, "program.py", "exec")
    del source
    if cfg["python_guard"]:
        _install_guard(cfg["workdir"])
    try:
        exec(code, _fresh_scope())
    except SystemExit as exc:  # an early exit did not finish the program's checks
        sys.stderr.write(f"SystemExit: the program called exit({exc.code!r}) before finishing\n")
        _finish(1)
    except BaseException:
        import traceback

        traceback.print_exc()
        _finish(1)
    _finish(0)


def _serve_candidate(cfg, source):
    """Define the function, then answer calls until the checker closes its end. Output of the untrusted code
    goes to this process's stdout/stderr, never to the protocol pipes (unless it writes there on purpose, which
    only garbles its own answers)."""
    requests, replies = cfg["in_fd"], cfg["out_fd"]
    entry_point = cfg["entry_point"]
    if cfg["python_guard"]:
        _install_guard(cfg["workdir"])
    scope = _fresh_scope()
    try:
        exec(compile(source, "candidate.py", "exec"), scope)
        function = scope.get(entry_point)
        if not callable(function):
            raise NameError(f"the code does not define a function {entry_point!r}")
    except BaseException as exc:
        send(replies, ["error", describe(exc)])
        _finish(1)
    del source, scope
    send(replies, ["ready"])
    while True:
        request = receive(requests)
        if request is None:
            _finish(0)
        if type(request) is not list or len(request) != 3 or request[0] != "call":
            _finish(2)
        _, args, kwargs = request
        try:
            result = function(*args, **kwargs)
        except BaseException as exc:  # SystemExit, KeyboardInterrupt too: the checker decides what they mean
            payload = encode(["raise", str.__str__(type(exc).__name__), _text(exc)[:1000]])
        else:
            try:
                payload = encode(["ok", result])
            except (ProtocolError, RecursionError) as exc:
                payload = encode(["bad", _text(exc)[:300]])
        send_encoded(replies, payload)


class CandidateError(Exception):
    """The candidate failed in a way that is not a plain builtin exception (it crashed, timed out, sent
    garbage, returned an unsupported type, or raised an exception the checker does not rebuild)."""


# Builtin exceptions the checker re-raises as themselves. Not StopIteration/StopAsyncIteration (inside the
# test's own loops they would end an iteration early and could skip checks), not BaseException-only ones.
_NOT_REBUILT = (StopIteration, StopAsyncIteration)


def _rebuild_exception(name, message):
    cls = getattr(builtins, name, None) if isinstance(name, str) else None
    if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, _NOT_REBUILT):
        try:
            return cls(message)
        except Exception:
            pass
    return CandidateError(f"the candidate raised {str(name)[:100]}: {str(message)[:300]}")


def _make_proxy(requests, replies):
    def candidate(*args, **kwargs):
        send(requests, ["call", args, kwargs])
        reply = receive(replies)
        if reply is None:
            raise CandidateError("the candidate's process ended during a call")
        if type(reply) is list and len(reply) == 2 and reply[0] == "ok":
            return reply[1]
        if type(reply) is list and len(reply) == 3 and reply[0] == "raise":
            raise _rebuild_exception(reply[1], reply[2])
        if type(reply) is list and len(reply) == 2 and reply[0] == "bad":
            raise CandidateError(f"the candidate returned a value that is not plain data: {str(reply[1])[:300]}")
        raise CandidateError("the candidate sent a malformed reply")

    return candidate


def _run_checker(cfg, source):
    """Trusted test code against the proxy; the verdict goes to the verdict pipe, as one JSON line."""
    requests, replies, verdict_fd = cfg["out_fd"], cfg["in_fd"], cfg["verdict_fd"]
    verdict = {"passed": False, "reason": "error: the checker did not finish"}
    try:
        scope = _fresh_scope()
        exec(compile(source, "test.py", "exec"), scope)
        proxy = _make_proxy(requests, replies)
        scope[cfg["entry_point"]] = scope["candidate"] = proxy
        hello = receive(replies)
        if hello is None:
            raise CandidateError("the candidate's process ended before it was ready")
        if type(hello) is list and len(hello) == 2 and hello[0] == "error" and type(hello[1]) is str:
            verdict = {"passed": False, "reason": "error: " + hello[1][:300], "candidate_failed": True}
        elif hello != ["ready"]:
            raise CandidateError("the candidate sent a malformed greeting")
        else:
            exec(compile(cfg["test_call"], "test.py", "exec"), scope)
            verdict = {"passed": True, "reason": "passed"}
    except MemoryError:
        verdict = {"passed": False, "reason": "memory"}
    except ProtocolError as exc:
        verdict = {"passed": False, "reason": "error: CandidateError: the candidate sent " + str(exc)[:250],
                   "candidate_failed": True}
    except CandidateError as exc:
        verdict = {"passed": False, "reason": "error: " + describe(exc), "candidate_failed": True}
    except BaseException as exc:
        verdict = {"passed": False, "reason": "error: " + describe(exc)}
    os.close(requests)  # the candidate reads end of file and exits
    data = (json.dumps(verdict) + "\n").encode("utf-8")
    while data:
        data = data[os.write(verdict_fd, data):]
    _finish(0)


def main(argv):
    cfg = json.loads(argv[1])
    _set_limits(cfg)
    os.chdir(cfg["workdir"])
    source = _read_source(cfg["source_fd"])
    role = cfg["role"]
    if role == "program":
        _run_program(cfg, source)
    elif role == "candidate":
        _serve_candidate(cfg, source)
    elif role == "checker":
        _run_checker(cfg, source)
    else:
        sys.stderr.write(f"sandbox: unknown role {role!r}\n")
        _finish(3)


if __name__ == "__main__":
    main(sys.argv)
