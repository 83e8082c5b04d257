"""Which files an ``--input`` names when it is a folder or a glob of Parquet files.

Shared by batch scoring (:mod:`flows.serving.batch`), the shard plan
(:mod:`flows.shards.plan`) and the command line's checks; it imports nothing heavy
at import time, so the checks that use it run before numpy is loaded.
"""

from __future__ import annotations

import glob
from pathlib import Path

#: Characters that make an --input a glob pattern.
GLOB_CHARS = "*?["


def expand_inputs(spec) -> tuple[Path, list[Path]]:
    """(root, files): the Parquet files a folder (searched recursively) or glob names, in
    sorted order, and the folder their relative output paths are taken from."""
    text = str(spec)
    if any(c in text for c in GLOB_CHARS):
        parts = Path(text).parts
        first = next(i for i, part in enumerate(parts) if any(c in part for c in GLOB_CHARS))
        root = Path(*parts[:first]) if first else Path.cwd()
        files = sorted(Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file())
    else:
        root = Path(text)
        files = sorted(p for p in root.rglob("*") if p.is_file())
    from cord_ops import data

    files = [f.absolute() for f in files if data.is_parquet(f)]
    if not files:
        raise ValueError(f"{text}: matches no .parquet/.pq file")
    return root.absolute(), files
