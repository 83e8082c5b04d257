"""What reading a file may cost: a decompressed-size budget for .npz and Parquet, checked
from the file's own headers before any array is allocated.

A compressed file can claim far more memory than it takes on disk: a 342 KB .npz of
zeros inflates to 720 MB, a 131 KB Parquet file to 1 GB, and a crafted .npy header
declaring shape (10^8, 300) makes numpy allocate 224 GiB before it reads a byte.
So before a file is read:

- .npz: every member's decompressed size comes from the zip directory and every
  array's shape and dtype from its .npy header (a few hundred bytes inflated); an
  array whose declared shape needs more bytes than its member holds is refused naming
  the file and the array (a truncated or crafted file), and so is an archive that
  decompresses beyond the budget. A lone .npy file gets the same header check.
- Parquet: the footer says how many values each column chunk holds and their physical
  type; values x width (or the chunk's uncompressed size, when larger) over every chunk
  is what reading it allocates, give or take the offsets of list columns.

The budget is ``max(CORD_OPS_MAX_DECOMPRESSED_MB MiB (default 512), 16 x the file's size
on disk)``: a file that is stored uncompressed, or compresses as real scores do (deflate
shrinks float logits by well under 2x), may be as large as the disk holds, while a small
file that inflates a thousandfold is refused by default. Refusals are ValueErrors whose
message starts with the file (docs/data-formats.md).
"""

from __future__ import annotations

import math
import os
import zipfile
from pathlib import Path

import numpy as np

#: The environment variable holding the budget in MiB; unset or empty: DEFAULT_BUDGET_MB.
BUDGET_ENV = "CORD_OPS_MAX_DECOMPRESSED_MB"
DEFAULT_BUDGET_MB = 512
#: A file may always decompress to this many times its own size.
EXPANSION = 16
_NPY_MAGIC = b"\x93NUMPY"
#: Bytes per value of Parquet's physical types (BYTE_ARRAY: at least its 4-byte offset).
_PHYSICAL_WIDTH = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8,
                   "INT96": 12, "BYTE_ARRAY": 4}


def budget_bytes() -> int:
    """The configured budget in bytes (``CORD_OPS_MAX_DECOMPRESSED_MB`` MiB, default 512)."""
    given = os.environ.get(BUDGET_ENV, "").strip()
    if not given:
        return DEFAULT_BUDGET_MB * 2**20
    try:
        value = float(given)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{BUDGET_ENV}={given!r}: expected a positive number of MiB")
    return int(value * 2**20)


def limit_for(file_size: int) -> int:
    """Bytes a file of ``file_size`` bytes may decompress to: the budget, or
    :data:`EXPANSION` times the file's size when that is more."""
    return max(budget_bytes(), EXPANSION * int(file_size))


def human(n: int) -> str:
    """``n`` bytes as KiB/MiB/GiB/TiB with three significant digits."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


def _over_budget(where: str, total: int, file_size: int) -> ValueError:
    return ValueError(
        f"{where}: decompresses to {human(total)} from {human(file_size)} on disk, over the "
        f"read budget of {human(limit_for(file_size))} (the larger of {BUDGET_ENV}, default "
        f"{DEFAULT_BUDGET_MB} MiB, and {EXPANSION} x the file's size); raise {BUDGET_ENV} "
        "if the file is yours")


def _declared_bytes(shape, dtype: np.dtype) -> int:
    return math.prod(int(n) for n in shape) * int(dtype.itemsize)


def _npy_header(handle):
    """(shape, dtype, header length) of the .npy stream ``handle``, or None when it has no
    readable header (the reader then reports the array as corrupt, naming it)."""
    try:
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(handle)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(handle)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, NotImplementedError):
        return None
    return shape, dtype, handle.tell()


def _check_array(where: str, name: str, shape, dtype, held: int) -> None:
    if dtype.hasobject:
        return  # pickled objects: refused by the reader (allow_pickle=False)
    needed = _declared_bytes(shape, dtype)
    if needed > held:
        raise ValueError(
            f"{where}: array '{name}' declares shape {tuple(int(n) for n in shape)} of "
            f"{dtype} ({human(needed)}) but holds {human(held)}; the file is truncated or "
            "crafted, and is not read")


def check_npz(source, where: str | None = None) -> None:
    """Refuse (ValueError naming the file, and the array where one is at fault) an .npz
    archive, or a lone .npy array, that would allocate more than its declared contents
    or more than :func:`limit_for` its size. ``source`` is a path or the file's bytes;
    ``where`` names the file in messages (default: the path). Files that are neither are
    left to the reader to refuse."""
    import io

    if isinstance(source, bytes | bytearray):
        file_size, handle = len(source), io.BytesIO(source)
    else:
        where = where or str(source)
        try:
            file_size, handle = Path(source).stat().st_size, open(source, "rb")
        except OSError:
            return  # missing or unreadable: the reader says so
    limit = limit_for(file_size)
    with handle:
        if handle.read(len(_NPY_MAGIC)) == _NPY_MAGIC:
            handle.seek(0)
            found = _npy_header(handle)
            if found is not None:  # what it may hold is its own size: within the budget
                shape, dtype, header = found
                _check_array(where, "(the .npy array)", shape, dtype, file_size - header)
            return
        handle.seek(0)
        try:
            archive = zipfile.ZipFile(handle)
        except (zipfile.BadZipFile, OSError, EOFError):
            return
        with archive:
            members = [info for info in archive.infolist() if not info.is_dir()]
            total = sum(info.file_size for info in members)
            if total > limit:
                raise _over_budget(where, total, file_size)
            for info in members:
                if not info.filename.endswith(".npy"):
                    continue
                try:
                    with archive.open(info) as member:
                        found = _npy_header(member)
                except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError):
                    found = None
                if found is not None:
                    shape, dtype, header = found
                    _check_array(where, info.filename[:-len(".npy")], shape, dtype,
                                 info.file_size - header)


def parquet_bytes(metadata) -> int:
    """What reading every column of a Parquet file allocates, from its footer
    (``pyarrow.parquet.FileMetaData``): per column chunk the larger of its values times
    their physical width and its uncompressed size."""
    total = 0
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            width = _PHYSICAL_WIDTH.get(chunk.physical_type)
            if width is None:  # FIXED_LEN_BYTE_ARRAY: its length is in the schema
                width = max(1, metadata.schema.column(c).length or 1)
            total += max(int(chunk.num_values) * width, int(chunk.total_uncompressed_size))
    return total


def check_parquet(path, where: str | None = None) -> None:
    """Refuse (ValueError naming the file) a Parquet file whose columns decompress to
    more than :func:`limit_for` its size, judged from its footer alone. An unreadable
    footer is left to the reader to refuse."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    where = where or str(path)
    file_size = Path(path).stat().st_size
    try:
        metadata = pq.read_metadata(path)
    except (pa.ArrowException, OSError):
        return
    total = parquet_bytes(metadata)
    if total > limit_for(file_size):
        raise _over_budget(where, total, file_size)
