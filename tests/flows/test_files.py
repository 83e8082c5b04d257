"""One file-set expander: a folder and a glob name the same files for batch scoring (and the
shard plan) and for the label-free monitor's batches; each reads its own suffixes."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.files import expand_inputs, files_in, is_glob
from flows.monitor.label_free.records import batch_files


def _touch(*paths: Path) -> None:
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")


@pytest.fixture
def tree(tmp_path) -> Path:
    _touch(tmp_path / "in" / "a.parquet", tmp_path / "in" / "day=1" / "b.PQ",
           tmp_path / "in" / "day=1" / "c.npz", tmp_path / "in" / "day=2" / "notes.txt")
    (tmp_path / "in" / "empty").mkdir()
    return tmp_path / "in"


def test_a_folder_and_a_recursive_glob_name_the_same_files(tree):
    expected = {tree / "a.parquet", tree / "day=1" / "b.PQ", tree / "day=1" / "c.npz",
                tree / "day=2" / "notes.txt"}
    assert set(files_in(tree)) == expected
    assert set(files_in(f"{tree}/**/*")) == expected
    assert set(files_in(f"{tree}/day=1/*")) == {tree / "day=1" / "b.PQ",
                                                tree / "day=1" / "c.npz"}
    assert files_in(tree / "empty") == []


def test_each_reader_keeps_its_suffixes_from_the_same_walk(tree):
    root, parquet = expand_inputs(f"{tree}/**/*")
    assert root == tree
    assert parquet == [tree / "a.parquet", tree / "day=1" / "b.PQ"]
    assert batch_files(f"{tree}/**/*") == [tree / "a.parquet", tree / "day=1" / "b.PQ",
                                           tree / "day=1" / "c.npz"]
    assert batch_files(tree) == batch_files(f"{tree}/**/*")


def test_a_single_file_and_the_errors_stay_each_readers_own(tree):
    assert batch_files(tree / "day=1" / "c.npz") == [tree / "day=1" / "c.npz"]
    with pytest.raises(ValueError, match=r"missing: no such file, folder or matching glob$"):
        batch_files(tree / "missing")
    with pytest.raises(ValueError, match=r"day=2: holds no \.npz/\.parquet/\.pq file$"):
        batch_files(tree / "day=2")
    with pytest.raises(ValueError, match=r"day=2: matches no \.parquet/\.pq file$"):
        expand_inputs(tree / "day=2")


@pytest.mark.parametrize("spec, glob", [("in/*.parquet", True), ("in/day=[12]", True),
                                        ("in/part?.pq", True), ("in/day=1", False)])
def test_a_glob_is_told_by_its_characters(spec, glob):
    assert is_glob(spec) is glob
