"""The warm runner beside the managed Prefect server: flow commands without the start-up cost.

Why it exists: a command in a fresh interpreter spends seconds importing
numpy/scipy/scikit-learn, Prefect, MLflow, onnx and onnxruntime and opening the MLflow
store's modules, longer than a small recalibration's flow itself takes
(docs/performance.md, "Command start-up"). The imports are the same every time, so
``cord-ops server start`` also starts this runner: one process that imports all of it once
and then waits on a Unix socket.

How a command uses it (:func:`forward`, called by the CLI after the command's own input
checks passed): when the managed server of the store runs, its runner is ready, and the
runner was started from the same cord-ops source, the same Python, the same Prefect,
MLflow and cord-ops environment variables and the same server credential
(:func:`fingerprint`), the command sends its
arguments, working folder and environment, and passes its own stdin, stdout and stderr
(``SCM_RIGHTS``). The runner forks a child that adopts those descriptors, folder and
environment and runs the command exactly as the CLI runs it in-process
(:func:`flows.cli.main.main`, handed to :func:`serve` by ``flows/cli/warm_main.py``), then reports
the exit status. Output, terminal detection, exit status and the ``error:`` contract are
the command's own. Anything that does not match sends the command down the ordinary
in-process path; nothing is half-forwarded (a runner that refuses answers before any work
starts).

Why the child parses the arguments again instead of receiving the command's checked
request (:mod:`flows.cli`: each command's ``validate`` builds one frozen request): a
recalibration's or monitoring run's request holds the arrays it loaded, which do not cross
this socket (a JSON message of at most :data:`flows.platform.warm_access.MAX_REQUEST_BYTES`,
4 MiB; nothing that could run code, as unpickling would, is ever read from it). So the
child runs the CLI on ``argv``: its validation re-reads the file the command names, and
its flow uses what that validation loaded. The command's own validation, before it
connects, is what makes a bad input fail at once and never reach the runner.

Operator promises, each tested in ``tests/flows/platform/test_warm_runner.py``:

- Ctrl-C / SIGTERM / SIGHUP to the command reach the child's process group; a command
  killed by a signal re-raises it on itself once the child is gone, so its exit status is
  the one an in-process command would have had.
- ``kill -9`` of the command: the child notices its control socket close and kills its
  own process group at once, exactly as the in-process command would have died (crash
  recovery of the registry then treats it like any killed run).
- A runner killed or stopped (``cord-ops server stop``) leaves no state a command trusts:
  its record names a pid and start time, and a dead or recycled pid is ignored.

Forking is safe here because the runner's parent loop is single-threaded (checked before
every fork; a runner that has grown a thread refuses, and the command runs in-process).

Who may hand it a command (:mod:`flows.platform.warm_access`): only a process of
the runner's own user. The socket is 0600 in the owner-only state folder, and the runner
does not trust that alone: it asks the kernel for the connecting process's uid
(``SO_PEERCRED``) and refuses any other before reading a byte. It runs only the commands of
:data:`COMMANDS`, as the CLI's parser reads them; a request that is not one (garbage, not
JSON, the wrong shape, too large) is refused, logged and forgotten, and the runner keeps
serving.

State, next to the managed server's (:mod:`flows.platform.managed_server`), in its
owner-only folder::

    <store folder>/prefect/runner.json   pid, start time, socket path, fingerprint (0600)
    <store folder>/prefect/runner.sock   the Unix socket (mode 0600: this user only)
    <store folder>/prefect/runner.log    the runner's own output (0600)

The fingerprint is an HMAC keyed with the managed server's credential, so neither the
record nor the runner's command line carries a value from which the environment's secrets
(a password in ``MLFLOW_TRACKING_URI``, say) could be guessed offline.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import hmac
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from flows.platform import credential, warm_access
from flows.store import owner

#: Commands the runner serves: the ones that run flows, and the ones whose few
#: milliseconds of work would otherwise wait seconds on the start-up (predict, status).
COMMANDS = ("recalibrate", "monitor", "demo", "predict", "status")
#: How the runner's fingerprint reaches it: in its environment, which only its user reads
#: (not its command line, which every local account reads).
FINGERPRINT_ENV = "CORD_OPS_WARM_FINGERPRINT"
#: Environment variables whose values are read when the runner imports Prefect and MLflow
#: (or that change what cord-ops does): a command whose values differ runs in-process.
ENV_PREFIXES = ("PREFECT_", "MLFLOW_", "CORD_OPS_")
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0
#: Modules a flow command needs; importing them here is the whole point of the runner.
WARM_MODULES = (
    "numpy", "scipy.optimize", "scipy.special", "sklearn.isotonic", "sklearn.linear_model",
    "pandas", "pyarrow.parquet", "matplotlib.pyplot",
    "prefect", "prefect.flow_engine", "prefect.task_engine", "prefect.client.orchestration",
    "mlflow", "mlflow.onnx", "mlflow.pyfunc", "mlflow.store.tracking.sqlalchemy_store",
    "mlflow.store.model_registry.sqlalchemy_store", "mlflow.store.db.utils",
    "alembic.command", "alembic.runtime.migration",
    "onnx", "onnxruntime", "skl2onnx",
    "flows.cli.main", "flows.recalibrate.flow", "flows.monitor.labelled",
)
_HEADER = struct.Struct("!I")


def record_file(folder: Path) -> Path:
    return folder / "runner.json"


def socket_path(folder: Path) -> Path:
    return folder / "runner.sock"


def log_file(folder: Path) -> Path:
    return folder / "runner.log"


def fingerprint(folder: Path, environ: dict[str, str] | None = None) -> str | None:
    """What the runner's imports depend on: this Python, the cord-ops source files (path,
    size, modification time), the Prefect profiles file and the environment variables
    that Prefect, MLflow and cord-ops read; keyed (HMAC-SHA256) with the credential of the
    managed server of ``folder``, so it changes with the credential and says nothing about
    the environment's values to whoever lacks it. None when there is no credential (no
    server: no runner to use). Equal fingerprints: a forked child runs the command as a
    fresh process would."""
    key = credential.load(folder)
    if key is None:
        return None
    environ = dict(os.environ if environ is None else environ)
    root = Path(__file__).resolve().parents[2]
    digest = hmac.new(key.encode(), f"{sys.executable}\0{root}".encode(), hashlib.sha256)
    for package in ("cord_ops", "onnx_export", "flows"):
        for path in sorted((root / package).rglob("*.py")):
            stat = path.stat()
            digest.update(f"{path.relative_to(root)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    home = Path(environ.get("PREFECT_HOME", Path.home() / ".prefect")).expanduser()
    profiles = Path(environ.get("PREFECT_PROFILES_PATH", home / "profiles.toml")).expanduser()
    with contextlib.suppress(OSError):
        digest.update(f"profiles:{profiles.stat().st_mtime_ns}".encode())
    # The owner marker differs per command by design; it is the command's, not the runner's.
    for key in sorted(k for k in environ if k.startswith(ENV_PREFIXES) and k != owner.OWNER_ENV):
        digest.update(f"{key}={environ[key]}".encode())
    return digest.hexdigest()


# ---------------------------------------------------------------- lifecycle
def running(folder: Path) -> dict | None:
    """The runner's record if its process is alive and is the one recorded: ``ready``
    once it listens, false while it is still importing."""
    try:
        record = json.loads(record_file(folder).read_text())
        same = owner.same_process(int(record["pid"]), record.get("stamp"),
                                  record.get("create_time"), tolerance=1.0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record if same else None


def spawn(folder: Path) -> int:
    """Start the runner of ``folder`` detached (its own session, output to runner.log);
    returns its pid. It becomes ready (record written, socket listening) once its imports
    are done: :func:`wait_ready`. Needs the managed server's credential in ``folder``."""
    credential.private_folder(folder)
    stop(folder)
    expected = fingerprint(folder, os.environ)
    if expected is None:
        raise FileNotFoundError(f"{credential.auth_file(folder)}: no managed server credential "
                                "(start the server first)")
    root = str(Path(__file__).resolve().parents[2])
    env = owner.detached_environment(os.environ)  # it outlives the command that starts it
    # The runner must import this checkout's modules, whichever folder it runs from.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env[FINGERPRINT_ENV] = expected
    with credential.open_private(log_file(folder), "ab") as log:
        log.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} warm runner\n".encode())
        log.flush()
        process = subprocess.Popen(
            [sys.executable, "-m", "flows.cli.warm_main", str(folder)],
            cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    # Recorded at once, so a second ``server start`` finds this one instead of starting
    # another while it imports.
    _write_record(folder, process.pid, expected, ready=False)
    return process.pid


def _write_record(folder: Path, pid: int, expected: str, ready: bool) -> None:
    credential.write_private(record_file(folder), json.dumps({
        "pid": pid, "create_time": owner.process_start_time(pid),
        "stamp": owner.process_stamp(pid), "ready": ready,
        "socket": str(socket_path(folder)), "fingerprint": expected, "written_at": time.time()},
        indent=2, sort_keys=True) + "\n")


def wait_ready(folder: Path, pid: int, timeout: float = READY_TIMEOUT_S) -> bool:
    """Whether the runner ``pid`` of ``folder`` became ready within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = running(folder)
        if record is not None and int(record["pid"]) == pid and record.get("ready"):
            return True
        if owner.process_start_time(pid) is None:
            owner.reap(pid)
            return False
        time.sleep(0.1)
    return False


def status(folder: Path) -> str:
    """One line on the runner of ``folder``."""
    record = running(folder)
    if record is None:
        return "warm runner: not running (commands start in-process)"
    if not record.get("ready"):
        return f"warm runner: pid {record['pid']}, still importing"
    same = record.get("fingerprint") == fingerprint(folder)
    return (f"warm runner: pid {record['pid']}, socket {record['socket']}"
            + ("" if same else "; started from other cord-ops sources or settings than this "
                               "shell's, so commands from here start in-process"))


def stop(folder: Path, timeout: float = STOP_TIMEOUT_S) -> int | None:
    """Stop the runner of ``folder``; returns its pid, or None when none was running.
    Commands it is running (their own process groups) finish on their own."""
    record = running(folder)
    pid = None
    if record is not None:
        pid = int(record["pid"])
        owner.terminate_group(pid, timeout)  # its group holds only itself
    record_file(folder).unlink(missing_ok=True)
    socket_path(folder).unlink(missing_ok=True)
    return pid


# ---------------------------------------------------------------- the command's side
def _send(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    body = json.dumps(message).encode()
    head = _HEADER.pack(len(body))
    if fds:
        socket.send_fds(sock, [head], fds)
        sock.sendall(body)
    else:
        sock.sendall(head + body)


def _receive(sock: socket.socket, with_fds: int = 0,
             limit: int | None = None) -> tuple[dict | None, list[int]]:
    """One message (None at end of stream) and the descriptors that came with it. With
    ``limit``, a message declared longer raises :class:`MalformedRequest` unread; one that
    is not JSON raises ``ValueError``."""
    fds: list[int] = []
    if with_fds:
        head, fds, _, _ = socket.recv_fds(sock, _HEADER.size, with_fds)
    else:
        head = sock.recv(_HEADER.size)
    while head and len(head) < _HEADER.size:
        more = sock.recv(_HEADER.size - len(head))
        if not more:
            break
        head += more
    if len(head) < _HEADER.size:
        return None, fds
    (size,) = _HEADER.unpack(head)
    if limit is not None and size > limit:
        raise warm_access.MalformedRequest(f"declares {size} bytes, more than {limit}")
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            return None, fds
        body += chunk
    return json.loads(body), fds


def forward(folder: Path, argv: list[str], started_ago: float) -> int | None:
    """Run the command ``argv`` in the warm runner of ``folder``; its exit status, or None
    when the runner is not there, not ready, or was started from other sources or
    settings (then nothing was run and the caller runs the command itself)."""
    record = running(folder)
    expected = fingerprint(folder)
    if (record is None or not record.get("ready") or expected is None
            or record.get("fingerprint") != expected):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(record["socket"])
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        _send(sock, {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ),
                     "fingerprint": record["fingerprint"], "started_ago": started_ago},
              fds=[0, 1, 2])
        reply, _ = _receive(sock)
    except OSError:
        sock.close()
        return None
    if reply is None or "pid" not in reply:
        sock.close()
        return None  # refused (or gone) before anything ran
    return _follow(sock, int(reply["pid"]))


def _follow(sock: socket.socket, child: int) -> int:
    """Wait for the child's exit status, passing this process's signals on to it."""
    received: list[int] = []

    def pass_on(signum, frame):
        received.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child, signum)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {signum: signal.signal(signum, pass_on) for signum in handled}
    try:
        message, _ = _receive(sock)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sock.close()
    if message is not None and "exit" in message:
        return int(message["exit"])
    if received:  # the child died of the signal this command got: so does the command
        signum = received[-1]
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        time.sleep(1.0)
    print(f"error: the warm runner's process for this command (pid {child}) ended without "
          "an exit status; see the runner log next to the Prefect server's state",
          file=sys.stderr, flush=True)
    return 1


# ---------------------------------------------------------------- the runner's side
def _warm_up(first_run) -> None:
    import importlib

    for name in WARM_MODULES:
        importlib.import_module(name)
    if first_run is not None:
        first_run()


def _child(conn: socket.socket, request: dict, fds: list[int], listener: socket.socket,
           entry) -> None:
    """In the forked child: become the command's process, run it, report its status."""
    code = 1
    finished = threading.Event()
    try:
        listener.close()
        os.setsid()  # a process group of its own: the command's signals reach all of it
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.stdout.reconfigure(line_buffering=True)
        sys.stderr.reconfigure(line_buffering=True)
        os.chdir(request["cwd"])
        # This process exists only to be the command: it takes the command's environment,
        # as an exec would.
        os.environ.clear()
        os.environ.update(request["env"])
        _send(conn, {"pid": os.getpid()})
        threading.Thread(target=_die_with_command, args=(conn, finished), daemon=True).start()
        started = time.perf_counter() - float(request["started_ago"])
        sys.argv = ["cord-ops", *request["argv"]]
        try:
            code = entry(request["argv"], started=started, forward=False,
                         owns_process=True)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # the child must always report and exit, never return to the loop
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        finished.set()
        with contextlib.suppress(OSError):
            _send(conn, {"exit": code})
        # What a normal interpreter exit runs (Prefect sends the logs and events it still
        # queues); the command has its status already and need not wait for it.
        with contextlib.suppress(Exception):
            atexit._run_exitfuncs()
        os._exit(code)


def _die_with_command(conn: socket.socket, finished: threading.Event) -> None:
    """The command never sends after its request: end of stream before the work finished
    means it died (kill -9); the work dies with it, as it would have in-process."""
    with contextlib.suppress(OSError):
        while conn.recv(1):
            pass
    if not finished.is_set():
        os.killpg(0, signal.SIGKILL)


def serve(folder: Path, expected: str, entry, parser, warm_up=None) -> None:
    """The runner's loop: warm up, listen, fork a child per command, which calls
    ``entry(argv, started=..., forward=False)`` (the CLI's ``main``) and exits with its
    status. ``parser`` (the CLI's) says which command a request's arguments name; only
    those of :data:`COMMANDS` are run. ``warm_up`` (no arguments), called once after the
    imports, does once what a command would otherwise pay for (the caller's: this module
    imports no flow)."""
    _warm_up(warm_up)
    if threading.active_count() != 1:
        print(f"warm runner: the warm-up started threads {threading.enumerate()}; not "
              "serving (forking would be unsafe)", flush=True)
        return
    path = socket_path(folder)
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_mask = os.umask(0o177)  # the socket is this user's only
    try:
        listener.bind(str(path))
    finally:
        os.umask(old_mask)
    listener.listen(16)
    stopping = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    _write_record(folder, os.getpid(), expected, ready=True)
    print(f"warm runner ready: pid {os.getpid()}, socket {path}", flush=True)
    try:
        while not stopping:
            with contextlib.suppress(InterruptedError):
                ready, _, _ = select.select([listener], [], [], 1.0)
            _reap()
            if not ready or stopping:
                continue
            try:
                conn, _ = listener.accept()
            except OSError as exc:  # out of descriptors, say: the next round tries again
                print(f"warm runner: accept failed: {exc}", flush=True)
                time.sleep(0.1)
                continue
            _handle(conn, listener, expected, entry, parser)
    finally:
        listener.close()
        with contextlib.suppress(OSError, ValueError):
            if json.loads(record_file(folder).read_text()).get("pid") == os.getpid():
                record_file(folder).unlink()
                path.unlink(missing_ok=True)


def _handle(conn: socket.socket, listener: socket.socket, expected: str, entry,
            parser) -> None:
    """One connection: refused (a reply, a line in the log) unless it is this user's and
    a well-formed request for a command the runner runs; then forked. Never raises: a bad
    request must not end the runner."""
    fds: list[int] = []
    try:
        problem = warm_access.peer_problem(conn)
        if problem is None:
            conn.settimeout(10.0)
            try:
                request, fds = _receive(conn, with_fds=3, limit=warm_access.MAX_REQUEST_BYTES)
                problem = warm_access.request_problem(request, fds, expected, parser, COMMANDS)
            except (ValueError, RecursionError) as exc:
                problem = f"malformed request: {type(exc).__name__}: {str(exc)[:200]}"
        if problem is not None:
            print(f"warm runner: refused a request: {problem}", flush=True)
            with contextlib.suppress(OSError):
                _send(conn, {"refused": problem})
            return
        if threading.active_count() != 1:
            with contextlib.suppress(OSError):
                _send(conn, {"refused": "the runner has threads; forking would be unsafe"})
            return
        conn.settimeout(None)
        if os.fork() == 0:
            _child(conn, request, fds, listener, entry)
    except Exception as exc:  # the loop outlives any one request
        print(f"warm runner: a request failed: {type(exc).__name__}: {exc}", flush=True)
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        conn.close()


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass

