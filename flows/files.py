"""Which files an input names when it is a folder or a glob: the one file-set expander.

It also remembers, for the length of a command, what the command line already read and
checked (:func:`preloaded`, :func:`read_once`), so the command's flow does not read a file
a second time.

Shared by batch scoring (:mod:`flows.serve.batch`), the shard plan
(:mod:`flows.shards.plan`), the label-free monitor's batches
(:mod:`flows.monitor.label_free.records`) and the command line's checks, so a pattern
names the same files in every command; it imports nothing heavy at import time, so the
checks that use it run before numpy is loaded.
"""

from __future__ import annotations

import contextlib
import glob
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

#: Characters that make an input a glob pattern.
GLOB_CHARS = "*?["


def is_glob(spec) -> bool:
    """Whether ``spec`` is a glob pattern (holds one of :data:`GLOB_CHARS`)."""
    return any(c in str(spec) for c in GLOB_CHARS)


def files_in(spec) -> list[Path]:
    """Every file a glob matches (``**`` recursing) or a folder holds (recursively), in no
    particular order, spelled as the pattern or folder spells them. Callers pick the
    suffixes they read and the order."""
    text = str(spec)
    if is_glob(text):
        return [Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file()]
    return [p for p in Path(text).rglob("*") if p.is_file()]


def expand_inputs(spec) -> tuple[Path, list[Path]]:
    """(root, files): the Parquet files a folder (searched recursively) or glob names, in
    sorted order, and the folder their relative output paths are taken from.

    Paths are absolute with ``.`` and ``..`` resolved as written (symbolic links are
    kept), and every file lies below ``root``: a glob whose ``..`` leads out of the
    folder it starts from (``in/*/../../elsewhere/*.parquet``) raises ValueError naming
    the file, since its output path would lead out of the output folder."""
    text = str(spec)
    if is_glob(text):
        parts = Path(text).parts
        first = next(i for i, part in enumerate(parts) if is_glob(part))
        root = Path(*parts[:first]) if first else Path.cwd()
    else:
        root = Path(text)
    from cord_ops import data

    root = _normal(root)
    files = sorted({_normal(f) for f in files_in(text) if data.is_parquet(f)})
    if not files:
        raise ValueError(f"{text}: matches no .parquet/.pq file")
    for file in files:
        if not file.is_relative_to(root):
            raise ValueError(f"{file}: matched by {text} but outside {root}, the folder the "
                             "pattern starts from; its output would land outside the output "
                             "folder (name the files from a folder above them)")
    return root, files


def _normal(path: Path) -> Path:
    """``path`` absolute, with ``.`` and ``..`` resolved as written."""
    return Path(os.path.normpath(path.absolute()))


# ---------------------------------------------------------------- files read once
T = TypeVar("T")
#: What this process's command line read and checked, by (absolute path, what was read).
_PRELOADED: dict[tuple[str, str], object] = {}
_PRELOADED_LOCK = threading.Lock()


@contextlib.contextmanager
def preloaded(*loaded: tuple[str | os.PathLike, str, object]):
    """Within the block, :func:`read_once` of a ``(path, kind, value)`` given returns that
    value instead of reading the file again: the command line read and checked it before
    anything started, and the run must use what was checked. ``kind`` names what was read
    and how (an input kind, a model's classes); a flow run in another process (a
    deployment's) reads its file."""
    keys = {(os.path.abspath(path), kind): value for path, kind, value in loaded}
    with _PRELOADED_LOCK:
        _PRELOADED.update(keys)
    try:
        yield
    finally:
        with _PRELOADED_LOCK:
            for key in keys:
                _PRELOADED.pop(key, None)


def read_once(path: str | os.PathLike, kind: str, read: Callable[[], T]) -> T:
    """What :func:`preloaded` holds for ``path`` read as ``kind``, else ``read()``."""
    with _PRELOADED_LOCK:
        found = _PRELOADED.get((os.path.abspath(path), kind))
    return found if found is not None else read()
