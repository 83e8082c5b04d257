"""One registry section per registered model at a time, across processes.

MLflow has no lock and no compare-and-set on aliases: two recalibrations of one model
that register, score the champion and move ``@champion`` at the same time both compare
against the old champion, and the last writer wins even with the worse model. The
section from registration to the alias move is therefore serialised per model name with
the strongest primitive the deployment offers (:func:`choose`):

``file``
    An OS file lock (``flock`` through :mod:`filelock`) in ``<store>/.cord-locks/`` for a
    sqlite or file store on this machine. The kernel releases it when the holder dies,
    however it dies, so a killed run never blocks the next one.
``prefect``
    A Prefect global concurrency limit of one slot named ``cord-ops-registry-<model>``
    when a Prefect server is configured (``PREFECT_API_URL``). The slot is a lease the
    holder renews; a killed holder's slot frees when the lease (:data:`PREFECT_LEASE`
    seconds) runs out.
``lease``
    Otherwise (a remote tracking server and no Prefect server): a lease written as a tag
    of the registered model, acquired by write-then-verify: read the tag, write our token
    when it is free (no holder, an expired lease, or a holder on this host whose process
    is gone), wait :data:`LEASE_SETTLE` seconds, read it back and hold the lock only if
    our token is still there. *Residual race*: two processes whose read and write of the
    tag are more than ``LEASE_SETTLE`` apart can both see their own token when they read
    back (A writes and verifies before B, which had read "free" earlier, writes and
    verifies). The tracking server offers no atomic conditional write, so this cannot be
    closed from the client; configure a Prefect server (or use a local store) where that
    matters. The lease is renewed while held and expires :data:`LEASE_TTL` seconds after
    the holder stops renewing it.

Whichever primitive, a waiting run logs who holds the lock and how long it will wait;
after ``timeout`` seconds it gives up with :class:`LockTimeout`.
Operator's view: docs/registry.md.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from cord_ops.atomic import write_json_atomic
from flows.errors import CordOpsError
from flows.store import owner, retries

LOCK_FOLDER = ".cord-locks"
#: Registered-model tag naming the holder (``prefect`` and ``lease`` locks).
HOLDER_TAG = "cord.lock.holder"
#: Registered-model tag of the ``lease`` lock: token, expiry and holder.
LEASE_TAG = "cord.lock.lease"
#: Seconds a ``lease`` lock lives without renewal; renewed every third of it.
LEASE_TTL = 60.0
#: Seconds between writing a lease and reading it back (see the module docstring).
LEASE_SETTLE = 0.5
#: Seconds a Prefect concurrency slot outlives a killed holder.
PREFECT_LEASE = 60.0
#: Default of ``--lock-timeout``: long enough for a queue of several runs' registry
#: sections (each takes seconds), short enough that a stuck queue is reported.
DEFAULT_TIMEOUT = 600.0
KINDS = ("file", "prefect", "lease")


class LockTimeout(CordOpsError, RuntimeError):
    """The registry lock of a model was not acquired within the timeout."""


def choose(local_store_folder: Path | None, prefect_api_url: str | None) -> str:
    """The lock kind for a store: ``file`` for a local store, else ``prefect`` when a
    Prefect server is configured, else ``lease``."""
    if local_store_folder is not None:
        return "file"
    return "prefect" if prefect_api_url else "lease"


def describe(holder: dict | None) -> str:
    """A holder record in words: its run and owner process."""
    if not holder:
        return "an unknown holder"
    who = owner.Owner.from_record(holder)
    run = holder.get("run_id")
    since = holder.get("acquired")
    parts = [f"run {run}" if run else "a run"]
    if who is not None:
        parts.append(f"({who.describe()})")
    if since:
        parts.append(f"since {time.strftime('%H:%M:%S', time.localtime(float(since)))}")
    return " ".join(parts)


@contextmanager
def registry_lock(kind: str, model_name: str, timeout: float, log, holder: dict,
                  *, client=None, store_folder: Path | None = None) -> Iterator[float]:
    """Hold the registry lock of ``model_name`` for the ``with`` body; yields the seconds
    waited. ``holder`` (the run id and owner record) is published for waiting runs.

    ``client`` (an MlflowClient) is needed by the ``prefect`` and ``lease`` kinds (the
    holder is published on the registered model, which must exist), ``store_folder`` by
    ``file``.
    """
    if kind not in KINDS:
        raise ValueError(f"lock kind: expected one of {KINDS}, got {kind!r}")
    holder = {**holder, "acquired": repr(time.time())}
    with ExitStack() as stack:
        if kind == "file":
            waited = _hold_file_lock(stack, Path(store_folder), model_name, timeout, log, holder)
        elif kind == "prefect":
            waited = _hold_prefect_slot(stack, client, model_name, timeout, log, holder)
        else:
            waited = _hold_lease(stack, client, model_name, timeout, log, holder)
        yield waited


def _wait(try_acquire: Callable[[float], bool], read_holder: Callable[[], dict | None],
          model_name: str, timeout: float, log) -> float:
    """Acquire at once if free; else log the holder and wait up to ``timeout`` seconds."""
    start = time.monotonic()
    if try_acquire(0.0):
        return 0.0
    holder = read_holder()
    log.info("registry lock of model '%s' is held by %s; waiting up to %.0f s",
             model_name, describe(holder), timeout)
    if not try_acquire(timeout):
        raise LockTimeout(f"registry lock of model '{model_name}' still held by "
                          f"{describe(read_holder() or holder)} after {timeout:g} s "
                          "(raise --lock-timeout to wait longer)")
    waited = time.monotonic() - start
    log.info("registry lock of model '%s' acquired after %.1f s", model_name, waited)
    return waited


# ---------------------------------------------------------------- file
def lock_paths(store_folder: Path, model_name: str) -> tuple[Path, Path]:
    """(lock file, holder record) of ``model_name`` in a local store folder."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", model_name)
    digest = uuid.uuid5(uuid.NAMESPACE_URL, model_name).hex[:8]  # distinct after escaping
    folder = store_folder / LOCK_FOLDER
    return folder / f"{safe}-{digest}.lock", folder / f"{safe}-{digest}.holder.json"


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _hold_file_lock(stack: ExitStack, store_folder: Path, model_name: str, timeout: float,
                    log, holder: dict) -> float:
    from filelock import FileLock, Timeout

    lock_file, holder_file = lock_paths(store_folder, model_name)
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    # thread_local=False: the flow's tasks may run on other threads than the one that
    # acquired; one lock object per section, so no re-entrancy is involved.
    lock = FileLock(lock_file, thread_local=False)

    def try_acquire(seconds: float) -> bool:
        try:
            lock.acquire(timeout=seconds, poll_interval=0.05)
            return True
        except Timeout:
            return False

    waited = _wait(try_acquire, lambda: _read_json(holder_file), model_name, timeout, log)
    stack.callback(lock.release)
    # Published after acquiring, removed before releasing: a record left by a killed
    # holder is overwritten by the next one (the kernel released its lock).
    write_json_atomic(holder_file, holder)
    stack.callback(holder_file.unlink, missing_ok=True)
    return waited


# ---------------------------------------------------------------- registered-model tags
def _model_tag(client, model_name: str, key: str) -> dict | None:
    try:
        value = client.get_registered_model(model_name).tags.get(key)
    except Exception:  # noqa: BLE001 - an unreadable holder only weakens a log line
        return None
    try:
        return json.loads(value) if value else None
    except ValueError:
        return None


def _publish_holder(stack: ExitStack, client, model_name: str, holder: dict) -> None:
    client.set_registered_model_tag(model_name, HOLDER_TAG, json.dumps(holder))

    def unpublish() -> None:
        try:
            if _model_tag(client, model_name, HOLDER_TAG) == holder:
                client.delete_registered_model_tag(model_name, HOLDER_TAG)
        except Exception:  # noqa: BLE001 - informational record; the next holder overwrites it
            pass

    stack.callback(unpublish)


# ---------------------------------------------------------------- prefect
def prefect_limit_name(model_name: str) -> str:
    return f"cord-ops-registry-{model_name}"


def _hold_prefect_slot(stack: ExitStack, client, model_name: str, timeout: float, log,
                       holder: dict) -> float:
    from prefect.client.orchestration import get_client
    from prefect.concurrency.sync import concurrency
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    name = prefect_limit_name(model_name)

    def busy() -> bool:
        """Whether the slot is taken; creates the one-slot limit on first use (and puts
        its limit back to one if someone changed it)."""
        with get_client(sync_client=True) as prefect:
            try:
                limit = prefect.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:
                limit = None
            if limit is None or limit.limit != 1:
                try:
                    prefect.upsert_global_concurrency_limit_by_name(name, 1)
                except ObjectAlreadyExists:
                    pass  # another run created it between our read and our create
                limit = prefect.read_global_concurrency_limit_by_name(name)
            return limit.active_slots > 0

    def try_acquire(seconds: float) -> bool:
        # "Acquire if free" asks the server whether the slot is taken: a short acquisition
        # timeout would also expire on a slow round trip and report a free lock as held.
        if seconds == 0.0 and busy():
            return False
        slot = concurrency(name, occupy=1, timeout_seconds=seconds or timeout,
                           lease_duration=PREFECT_LEASE, strict=True)
        try:
            stack.enter_context(slot)
            return True
        except TimeoutError:
            return False

    waited = _wait(try_acquire, lambda: _model_tag(client, model_name, HOLDER_TAG),
                   model_name, timeout, log)
    _publish_holder(stack, client, model_name, holder)
    return waited


# ---------------------------------------------------------------- lease
def _lease_free(lease: dict | None, token: str, now: float) -> bool:
    if not lease or lease.get("token") == token:
        return True
    if float(lease.get("expires", 0)) <= now:
        return True
    who = owner.Owner.from_record(lease)
    return who is not None and who.is_local() and not who.process_alive()


def _hold_lease(stack: ExitStack, client, model_name: str, timeout: float, log,
                holder: dict) -> float:
    token = uuid.uuid4().hex

    def write(expires: float) -> None:
        client.set_registered_model_tag(model_name, LEASE_TAG, json.dumps(
            {**holder, "token": token, "expires": repr(expires)}))

    def attempt() -> bool:
        if not _lease_free(_model_tag(client, model_name, LEASE_TAG), token, time.time()):
            return False
        write(time.time() + LEASE_TTL)
        time.sleep(LEASE_SETTLE)
        current = _model_tag(client, model_name, LEASE_TAG)
        return bool(current) and current.get("token") == token

    def try_acquire(seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while True:
            try:
                if attempt():
                    return True
            except Exception as exc:
                # Another process's write holding an embedded store's database for longer
                # than sqlite's busy timeout is contention, not a failure: try again.
                if not retries.is_transient(exc):
                    raise
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

    waited = _wait(try_acquire, lambda: _model_tag(client, model_name, LEASE_TAG),
                   model_name, timeout, log)
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(LEASE_TTL / 3):
            try:
                current = _model_tag(client, model_name, LEASE_TAG)
                if current and current.get("token") == token:
                    write(time.time() + LEASE_TTL)
            except Exception:  # noqa: BLE001 - the next renewal may get through
                pass

    renewer = threading.Thread(target=renew, name="cord-ops-lease", daemon=True)
    renewer.start()

    def release() -> None:
        stop.set()
        renewer.join(timeout=5)
        try:
            current = _model_tag(client, model_name, LEASE_TAG)
            if current and current.get("token") == token:
                client.delete_registered_model_tag(model_name, LEASE_TAG)
        except Exception:  # noqa: BLE001 - an unreleased lease expires after LEASE_TTL
            pass

    stack.callback(release)
    return waited
