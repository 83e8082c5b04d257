"""Who may hand the warm runner a command, and which requests it runs.

The runner (:mod:`flows.platform.warm`) forks a child that becomes the command: it takes the
request's arguments, working folder, environment and descriptors and runs as the runner's
user. So a request is run only when all of these hold, each checked here:

- the connecting process is the runner's own user: the kernel's record of the peer
  (``SO_PEERCRED``), not the socket's mode, which a umask, a ``chmod`` or a shared group
  can widen (:func:`peer_problem`); where the system cannot say, nobody is;
- the request has the shape :func:`flows.platform.warm.forward` sends and is at most
  :data:`MAX_REQUEST_BYTES` (:func:`request_problem`);
- it carries the runner's fingerprint (the same sources, settings and server credential);
- its arguments name one of the runner's commands as the CLI's own parser reads them
  (global options before the command included), not any argv.

Anything else is refused with a reason; the runner logs it and keeps serving.
"""

from __future__ import annotations

import contextlib
import hmac
import io
import math
import os
import socket
import struct

#: A request (arguments, folder, environment) larger than this is refused unread; Linux
#: caps a process's arguments and environment together at a quarter of its stack limit,
#: 2 MiB by default.
MAX_REQUEST_BYTES = 4 << 20
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class MalformedRequest(ValueError):
    """What came in on the runner's socket is not a request it serves."""


def peer_uid(conn: socket.socket) -> int | None:
    """The uid of the process at the other end of the Unix socket ``conn``, as the kernel
    recorded it when that process connected; None where the system cannot say."""
    if not hasattr(socket, "SO_PEERCRED"):
        return None
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    return _PEERCRED.unpack(raw)[1]


def peer_problem(conn: socket.socket) -> str | None:
    """Why the process at the other end of ``conn`` may not hand this process a command,
    or None when it runs as this process's user."""
    uid = peer_uid(conn)
    if uid is None:
        return "this system does not say which user connected"
    if uid != os.geteuid():
        return f"connected as uid {uid}, not the runner's uid {os.geteuid()}"
    return None


def command_of(parser, argv: list[str]) -> str | None:
    """The cord-ops command ``argv`` names, as the CLI's ``parser`` reads it; None when the
    parser rejects the arguments (its messages are swallowed: they are the caller's)."""
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            return getattr(parser.parse_args(argv), "command", None)
    except SystemExit:
        return None


def _text(value) -> bool:
    return isinstance(value, str) and "\0" not in value


def request_problem(request, fds: list[int], expected: str, parser,
                    commands: tuple[str, ...]) -> str | None:
    """Why ``request`` (with the descriptors that came with it) is not one to run, or None:
    three descriptors, a dict of ``argv`` (strings), ``cwd`` (an absolute path), ``env``
    (names to strings), ``started_ago`` (seconds, finite, >= 0) and ``fingerprint`` equal to
    ``expected``, and ``argv`` naming one of ``commands`` as ``parser`` reads it."""
    if request is None or len(fds) != 3:
        return "incomplete request"
    if not isinstance(request, dict):
        return "not a request"
    argv, cwd, env, ago = (request.get(k) for k in ("argv", "cwd", "env", "started_ago"))
    if not (isinstance(argv, list) and all(_text(a) for a in argv)):
        return "argv is not a list of strings"
    if not (_text(cwd) and os.path.isabs(cwd)):
        return "cwd is not an absolute path"
    if not (isinstance(env, dict) and all(_text(k) and k and "=" not in k and _text(v)
                                          for k, v in env.items())):
        return "env is not a mapping of names to strings"
    if isinstance(ago, bool) or not isinstance(ago, int | float) or not (
            math.isfinite(ago) and ago >= 0):
        return "started_ago is not a non-negative number"
    given = request.get("fingerprint")
    if not isinstance(given, str) or not hmac.compare_digest(given.encode(), expected.encode()):
        return "started from other sources or settings"
    if command_of(parser, argv) not in commands:
        return f"not a command the warm runner runs (it runs {', '.join(commands)})"
    return None
