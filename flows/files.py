"""Which files an ``--input`` names when it is a folder or a glob of Parquet files.

Shared by batch scoring (:mod:`flows.serve.batch`), the shard plan
(:mod:`flows.shards.plan`) and the command line's checks; it imports nothing heavy
at import time, so the checks that use it run before numpy is loaded.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

#: Characters that make an --input a glob pattern.
GLOB_CHARS = "*?["


def expand_inputs(spec) -> tuple[Path, list[Path]]:
    """(root, files): the Parquet files a folder (searched recursively) or glob names, in
    sorted order, and the folder their relative output paths are taken from.

    Paths are absolute with ``.`` and ``..`` resolved as written (symbolic links are
    kept), and every file lies below ``root``: a glob whose ``..`` leads out of the
    folder it starts from (``in/*/../../elsewhere/*.parquet``) raises ValueError naming
    the file, since its output path would lead out of the output folder."""
    text = str(spec)
    if any(c in text for c in GLOB_CHARS):
        parts = Path(text).parts
        first = next(i for i, part in enumerate(parts) if any(c in part for c in GLOB_CHARS))
        root = Path(*parts[:first]) if first else Path.cwd()
        files = [Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file()]
    else:
        root = Path(text)
        files = [p for p in root.rglob("*") if p.is_file()]
    from cord_ops import data

    root = _normal(root)
    files = sorted({_normal(f) for f in files if data.is_parquet(f)})
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
