"""Atomic file writes: a failure never leaves a half-written file at the destination.

Every writer of saved state (CORD and calibrator JSON, .npz data, ONNX models, prediction
outputs, plots, reports) goes through :func:`atomic_path`, so the rule lives in one place.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path``.

    The temporary file lives in the destination folder (so ``os.replace`` is a rename on
    one file system), is flushed to disk before the rename, gets ordinary 0644
    permissions, and is removed if the body raises.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
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
