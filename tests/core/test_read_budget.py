"""The read budget: a small .npz or Parquet file that decompresses to
hundreds of MB, or an .npy header that declares a huge shape, is refused with one line
naming the file (and the array) before anything is allocated; CORD_OPS_MAX_DECOMPRESSED_MB
raises the budget."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cord_ops import data, read_budget
from cord_ops.scoring_files import read_input
from flows.cli.main import main

_BLOCK = 1 << 22


def _npy_header(shape, descr: str = "<f8") -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": descr, "fortran_order": False,
                                                "shape": tuple(shape)})
    return out.getvalue()


def _deflated_zeros(header: bytes, n_zero_bytes: int) -> tuple[bytes, int]:
    """(raw deflate stream, CRC-32) of ``header`` followed by ``n_zero_bytes`` zeros, built
    from one compressed block repeated (a full flush makes every block start afresh), so
    hundreds of MB of zeros cost a second of CRC, not a compressor's pass."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    parts = [compressor.compress(header) + compressor.flush(zlib.Z_FULL_FLUSH)]
    crc = zlib.crc32(header)
    zeros = bytes(_BLOCK)
    block = compressor.compress(zeros) + compressor.flush(zlib.Z_FULL_FLUSH)
    whole, rest = divmod(n_zero_bytes, _BLOCK)
    parts += [block] * whole
    for _ in range(whole):
        crc = zlib.crc32(zeros, crc)
    if rest:
        parts.append(compressor.compress(zeros[:rest]) + compressor.flush(zlib.Z_FULL_FLUSH))
        crc = zlib.crc32(zeros[:rest], crc)
    parts.append(compressor.flush(zlib.Z_FINISH))
    return b"".join(parts), crc


def _zip(path, members: dict[str, tuple[bytes, int, int]]) -> None:
    """A zip archive of deflated members ``name: (stream, crc, uncompressed size)``."""
    out, central = io.BytesIO(), []
    for name, (stream, crc, size) in members.items():
        offset = out.tell()
        encoded = name.encode()
        out.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0x21, crc,
                              len(stream), size, len(encoded), 0) + encoded + stream)
        central.append(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 8, 0, 0x21,
                                   crc, len(stream), size, len(encoded), 0, 0, 0, 0, 0,
                                   offset) + encoded)
    start = out.tell()
    directory = b"".join(central)
    out.write(directory + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(central),
                                      len(central), len(directory), start, 0))
    path.write_bytes(out.getvalue())


def _zeros_npz(path, rows: int, k: int) -> None:
    """An honest .npz of zero logits (rows x k float64) and zero labels, deflated."""
    labels = io.BytesIO()
    np.lib.format.write_array(labels, np.zeros(rows, np.int64))
    members = {}
    for name, header, n in (("logits.npy", _npy_header((rows, k)), rows * k * 8),):
        stream, crc = _deflated_zeros(header, n)
        members[name] = (stream, crc, len(header) + n)
    raw = labels.getvalue()
    members["labels.npy"] = (zlib.compress(raw, 9)[2:-4], zlib.crc32(raw), len(raw))
    _zip(path, members)


def test_a_small_npz_that_inflates_to_720_mb_is_refused_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv(read_budget.BUDGET_ENV, raising=False)
    bomb = tmp_path / "bomb.npz"
    _zeros_npz(bomb, 900_000, 100)  # 720 MB of float64 zeros
    assert bomb.stat().st_size < 1_000_000
    with zipfile.ZipFile(bomb) as archive:  # an honest archive: its sizes are the truth
        assert sum(i.file_size for i in archive.infolist()) > 720_000_000
    for load in (data.load_npz, lambda p: read_input(p, 100, "logits", np.float64)):
        with pytest.raises(ValueError, match=rf"^{bomb}: decompresses to 69\d MiB from "
                                             rf".* {read_budget.BUDGET_ENV}"):
            load(bomb)


def test_the_budget_option_raises_and_lowers_the_limit(tmp_path, monkeypatch):
    small = tmp_path / "small.npz"
    _zeros_npz(small, 4096, 256)  # 8 MiB from a few KB
    assert small.stat().st_size * read_budget.EXPANSION < 2**20
    monkeypatch.delenv(read_budget.BUDGET_ENV, raising=False)
    assert data.load_npz(small).scores.shape == (4096, 256)
    monkeypatch.setenv(read_budget.BUDGET_ENV, "1")
    with pytest.raises(ValueError, match=rf"^{small}: decompresses to 8.03 MiB from "):
        data.load_npz(small)
    monkeypatch.setenv(read_budget.BUDGET_ENV, "16")
    assert data.load_npz(small).n == 4096
    monkeypatch.setenv(read_budget.BUDGET_ENV, "lots")
    with pytest.raises(ValueError, match=rf"^{read_budget.BUDGET_ENV}='lots': expected"):
        data.load_npz(small)


def test_an_uncompressed_file_may_be_larger_than_the_budget(tmp_path, monkeypatch):
    monkeypatch.setenv(read_budget.BUDGET_ENV, "1")
    path = tmp_path / "plain.npz"
    np.savez(path, logits=np.zeros((2048, 128)), labels=np.zeros(2048, np.int64))  # 2 MiB
    assert data.load_npz(path).scores.shape == (2048, 128)


def _crafted(path, shape) -> None:
    """An .npz whose logits header declares ``shape`` but whose member holds 800 bytes."""
    labels = io.BytesIO()
    np.lib.format.write_array(labels, np.zeros(100, np.int64))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("logits.npy", _npy_header(shape) + bytes(800))
        archive.writestr("labels.npy", labels.getvalue())


def test_a_header_declaring_a_huge_shape_is_refused_naming_file_and_array(tmp_path, capsys):
    crafted = tmp_path / "crafted.npz"
    _crafted(crafted, (100_000_000, 300))  # 224 GiB of float64
    with pytest.raises(ValueError, match=rf"^{crafted}: array 'logits' declares shape "
                                         r"\(100000000, 300\) of float64 \(224 GiB\) but holds "
                                         r"800 bytes"):
        data.load_npz(crafted)
    with pytest.raises(ValueError, match=rf"^{crafted}: array 'logits' declares shape"):
        read_input(crafted, 300, "logits", np.float64)
    assert main(["recalibrate", "--data", str(crafted)]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"error: {crafted}: array 'logits' declares shape")
    assert "MemoryError" not in line


def _zeros_parquet(path, rows: int) -> None:
    table = pa.table({"logits_0": np.zeros(rows), "logits_1": np.ones(rows),
                      "labels": np.zeros(rows, np.int64)})
    pq.write_table(table, path, compression="zstd")


def test_a_parquet_file_that_inflates_past_the_budget_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "zeros.parquet"
    _zeros_parquet(path, 1 << 19)  # 12 MiB of columns from a few KB
    assert path.stat().st_size * read_budget.EXPANSION < 2**20
    monkeypatch.delenv(read_budget.BUDGET_ENV, raising=False)
    assert data.load_parquet(path).n == 1 << 19
    monkeypatch.setenv(read_budget.BUDGET_ENV, "1")
    with pytest.raises(ValueError, match=rf"^{path}: decompresses to 12(.0\d)? MiB"):
        data.load_parquet(path)
    with pytest.raises(ValueError, match=rf"^{path}: decompresses to 12(.0\d)? MiB"):
        data.read_parquet_table(path)
    # by default: the 131 KB file that reads as 1 GB is over the budget
    monkeypatch.delenv(read_budget.BUDGET_ENV)
    assert read_budget.limit_for(131 * 1024) < 10**9


def test_a_lone_npy_and_a_version_2_header_are_checked_too(tmp_path, monkeypatch):
    monkeypatch.delenv(read_budget.BUDGET_ENV, raising=False)
    lone = tmp_path / "lone.npy"
    lone.write_bytes(_npy_header((100_000_000, 300)) + bytes(800))
    with pytest.raises(ValueError) as caught:
        read_budget.check_npz(lone)
    assert str(caught.value) == (
        f"{lone}: array '(the .npy array)' declares shape (100000000, 300) of float64 "
        "(224 GiB) but holds 800 bytes; the file is truncated or crafted, and is not read")
    honest = tmp_path / "honest.npy"
    np.save(honest, np.zeros((64, 8)))
    monkeypatch.setenv(read_budget.BUDGET_ENV, "0.001")
    read_budget.check_npz(honest)  # holds what it declares: never over its own size
    small = tmp_path / "small.npz"
    _zeros_npz(small, 4096, 256)
    with pytest.raises(ValueError, match=r"^bytes in memory: decompresses to 8.03 MiB"):
        read_budget.check_npz(small.read_bytes(), "bytes in memory")

    monkeypatch.delenv(read_budget.BUDGET_ENV)
    header = io.BytesIO()  # format 2.0 (a header over 64 KiB, e.g. many fields)
    np.lib.format.write_array_header_2_0(header, {"descr": "<f4", "fortran_order": False,
                                                   "shape": (10**9, 10)})
    version2 = tmp_path / "v2.npz"
    with zipfile.ZipFile(version2, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("probs.npy", header.getvalue() + bytes(40))
    with pytest.raises(ValueError, match=rf"^{version2}: array 'probs' declares shape "
                                         r"\(1000000000, 10\) of float32 \(37.3 GiB\) but "
                                         r"holds 40 bytes"):
        read_budget.check_npz(version2)


def test_parquet_reading_cost_is_values_times_their_width(tmp_path, monkeypatch):
    path = tmp_path / "zeros.parquet"
    _zeros_parquet(path, 1 << 19)
    assert read_budget.parquet_bytes(pq.read_metadata(path)) == 3 * 8 * (1 << 19)  # 12 MiB
    monkeypatch.setenv(read_budget.BUDGET_ENV, "12")  # exactly what it needs: read
    read_budget.check_parquet(path)
    monkeypatch.setenv(read_budget.BUDGET_ENV, "11.99")
    with pytest.raises(ValueError, match=rf"^{path}: decompresses to 12 MiB from "):
        read_budget.check_parquet(path)
    # fixed-width binary values: their declared length, one byte each here
    ids = tmp_path / "ids.parquet"
    zeros = pa.array(np.zeros(100_000, np.int8))
    pq.write_table(pa.table({
        "code": pa.DictionaryArray.from_arrays(zeros, pa.array([b"xyz"], pa.binary(3))),
        "flag": pa.DictionaryArray.from_arrays(zeros, pa.array([b"y"], pa.binary(1)))}), ids)
    assert read_budget.parquet_bytes(pq.read_metadata(ids)) == 300_000 + 100_000


def test_the_npz_budget_boundary_and_the_whole_refusal(tmp_path, monkeypatch):
    small = tmp_path / "small.npz"
    _zeros_npz(small, 4096, 256)
    with zipfile.ZipFile(small) as archive:
        total = sum(i.file_size for i in archive.infolist())
    monkeypatch.setenv(read_budget.BUDGET_ENV, str(total / 2**20))  # exactly what it needs
    read_budget.check_npz(small)
    monkeypatch.setenv(read_budget.BUDGET_ENV, str((total - 1) / 2**20))
    with pytest.raises(ValueError) as caught:
        read_budget.check_npz(small)
    size = read_budget.human(small.stat().st_size)
    assert str(caught.value) == (
        f"{small}: decompresses to 8.03 MiB from {size} on disk, over the read budget of "
        f"8.03 MiB (the larger of {read_budget.BUDGET_ENV}, default 512 MiB, and 16 x the "
        f"file's size); raise {read_budget.BUDGET_ENV} if the file is yours")
    for given in ("0", "-1", "inf", "nan"):
        monkeypatch.setenv(read_budget.BUDGET_ENV, given)
        with pytest.raises(ValueError, match=rf"^{read_budget.BUDGET_ENV}='{given}': expected "
                                             "a positive number of MiB$"):
            read_budget.budget_bytes()


@pytest.mark.parametrize("n, shown", [(1023, "1023 bytes"), (1024, "1 KiB"),
                                      (1536, "1.5 KiB"), (2**20 - 1, "1.02e+03 KiB"),
                                      (2**20, "1 MiB"), (2**30, "1 GiB"), (3 * 2**40, "3 TiB")])
def test_sizes_are_shown_in_binary_units(n, shown):
    assert read_budget.human(n) == shown


def test_other_members_are_skipped_and_a_broken_one_is_left_to_the_reader(tmp_path):
    mixed = tmp_path / "mixed.npz"  # a non-array member before the crafted one
    with zipfile.ZipFile(mixed, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("README.txt", "made by hand")
        archive.writestr("logits.npy", _npy_header((100_000_000, 300)) + bytes(800))
    with pytest.raises(ValueError, match=rf"^{mixed}: array 'logits' declares shape"):
        read_budget.check_npz(mixed)
    broken = tmp_path / "broken.npz"
    np.savez(broken, logits=np.zeros((4, 3)), labels=np.zeros(4, np.int64))
    raw = bytearray(broken.read_bytes())
    second = raw.index(b"PK\x03\x04", 4)
    raw[second:second + 4] = b"PK\x00\x00"  # the labels' local header no longer opens
    broken.write_bytes(bytes(raw))
    read_budget.check_npz(broken)  # nothing to judge: the reader names what is wrong
    with pytest.raises(ValueError, match=rf"^{broken}: array 'labels' is corrupt "):
        data.load_npz(broken)
