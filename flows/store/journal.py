"""A local journal of failures the tracking store could not record.

When a recalibration fails because the store itself failed (unreachable, killed, full),
writing "this run FAILED" through that same store fails too, and the run would stay
RUNNING. The failure is then written here instead, one JSON file per failure, and the
next command against the same store replays it (:func:`replay`) before it starts a run.

Where: next to the store for a local store (``<store>/.cord-journal/``); for a remote
store, or when that folder cannot be written (a full disk), under
``$XDG_CACHE_HOME/cord-ops/journal/<hash of the tracking URI>/`` (default
``~/.cache``). :func:`replay` reads both.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from cord_ops.atomic import write_json_atomic

FOLDER = ".cord-journal"
VERSION = 1


def cache_folder(uri: str) -> Path:
    """The per-URI journal folder in the user's cache directory."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "cord-ops" / "journal" / hashlib.sha256(uri.encode()).hexdigest()[:16]


def folders(uri: str, store_folder: Path | None) -> list[Path]:
    """Journal folders of ``uri``, preferred first."""
    found = [] if store_folder is None else [store_folder / FOLDER]
    return [*found, cache_folder(uri)]


def record(uri: str, store_folder: Path | None, entry: dict) -> Path:
    """Write ``entry`` (JSON-able) to the first journal folder that takes it; returns the
    file. Raises the last OSError when no folder can be written."""
    payload = {"journal_version": VERSION, "tracking_uri": uri, "recorded": time.time(),
               **entry}
    name = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}.json"
    error: OSError | None = None
    for folder in folders(uri, store_folder):
        try:
            return write_json_atomic(folder / name, payload)
        except OSError as exc:
            error = exc
    raise error  # type: ignore[misc]


def pending(uri: str, store_folder: Path | None) -> list[Path]:
    """Journal files of ``uri`` not yet replayed, oldest first."""
    files = []
    for folder in folders(uri, store_folder):
        if folder.is_dir():
            files += [p for p in folder.glob("*.json") if not p.name.startswith(".")]
    return sorted(files, key=lambda p: p.name)


def replay(uri: str, store_folder: Path | None, apply: Callable[[dict], None]) -> list[Path]:
    """Apply every pending entry of ``uri`` with ``apply`` and delete it once applied.

    Stops at the first entry ``apply`` fails on (the store is still failing: the entry
    stays for the next command) by raising that error. Entries written for another URI
    (a hash collision) are left alone. Returns the files replayed.
    """
    done = []
    for path in pending(uri, store_folder):
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # unreadable: not ours to judge; left for a person to look at
        if entry.get("tracking_uri") != uri:
            continue
        apply(entry)
        path.unlink(missing_ok=True)
        done.append(path)
    return done
