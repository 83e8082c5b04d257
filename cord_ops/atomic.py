"""Atomic file writes: a failure never leaves a half-written file at the destination.

Every writer of saved state (CORD and calibrator JSON, .npz data, ONNX models, prediction
outputs, plots, reports) goes through :func:`atomic_path`, so the rule lives in one place.

A process killed mid-write (SIGKILL, power loss) cannot remove its temporary file. The
file's name carries the writer's pid, so the next write to the same folder sweeps the
temporary files of writers that no longer run (:func:`sweep_stale`); a live writer's file
is never touched. Temporary folders (:func:`owned_temporary_directory`) follow the same
rule. The check is by pid on this host: a folder shared over the network with
writers on other hosts would need a different rule.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: ``.<name>.<pid>.<random>.tmp``: what :func:`atomic_path` creates.
_TMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[^.]+\.tmp$")
#: ``<prefix><pid>-<random>``: what :func:`owned_temporary_directory` creates.
_TMP_FOLDER = re.compile(r"^(?P<prefix>.+?)(?P<pid>\d+)-[^-]+$")
#: Temporary files of an older naming (no pid) are swept only after this many seconds.
UNNAMED_STALE_AFTER = 24 * 3600.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True


def sweep_stale(folder) -> list[Path]:
    """Remove temporary files of interrupted atomic writes in ``folder``: those whose
    writer process is gone. Returns what was removed; errors are ignored (a sweep must
    never fail the write that triggered it)."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if not (entry.name.startswith(".") and entry.name.endswith(".tmp")):
            continue
        match = _TMP_NAME.match(entry.name)
        try:
            if match is not None:
                stale = int(match["pid"]) != os.getpid() and not _pid_alive(int(match["pid"]))
            else:
                stale = time.time() - entry.stat().st_mtime > UNNAMED_STALE_AFTER
            if stale and entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
        except OSError:
            continue
    return removed


def _create_temporary(target: Path) -> Path:
    """A new empty file ``.<name>.<pid>.<random>.tmp`` beside ``target``, made with mode
    0666 under the umask (``tempfile.mkstemp`` would make it 0600 whatever the umask)."""
    for _ in range(100):
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"{target.parent}: no free temporary name for {target.name}")


@contextmanager
def atomic_path(path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path``.

    The temporary file lives in the destination folder (so ``os.replace`` is a rename on
    one file system), is flushed to disk before the rename, and is removed if the body
    raises. It is created as ``open()`` creates a file, 0666 less the process's umask (the
    ``cord-ops`` command sets an owner-only one unless told otherwise: docs/security.md),
    so the file and the folders made for it are as private as the user asked. Leftovers
    of killed writers in that folder are swept first.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(target.parent)
    tmp = _create_temporary(target)
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path, payload) -> Path:
    """Write ``payload`` as indented, key-sorted JSON atomically; returns the path."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    return Path(path)


def write_bytes_atomic(path, data: bytes) -> Path:
    """Write ``data`` atomically; returns the path."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


@contextmanager
def owned_temporary_directory(prefix: str) -> Iterator[Path]:
    """A temporary folder ``<tmp>/<prefix><pid>-<random>``, removed on exit like
    ``tempfile.TemporaryDirectory``; first the folders of this prefix left by processes
    that no longer run (killed inside the block) are removed."""
    import shutil

    base = Path(tempfile.gettempdir())
    try:
        entries = list(os.scandir(base))
    except OSError:
        entries = []
    for entry in entries:
        match = _TMP_FOLDER.match(entry.name)
        if match is None or match["prefix"] != prefix:
            continue
        pid = int(match["pid"])
        try:
            if (pid != os.getpid() and not _pid_alive(pid)
                    and entry.is_dir(follow_symlinks=False)):
                shutil.rmtree(entry.path, ignore_errors=True)
        except OSError:
            continue
    folder = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
