"""Atomic writes: the destination holds either the old content or the new, never a part."""

from __future__ import annotations

import json

import pytest

from cord_ops.atomic import atomic_path, write_json_atomic


def test_failure_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "state.json"
    write_json_atomic(target, {"eta": 1.5})
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_path(target) as tmp:
            tmp.write_text('{"eta": 2.')
            raise RuntimeError("disk full")
    assert json.loads(target.read_text()) == {"eta": 1.5}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_success_replaces_and_creates_folders(tmp_path):
    target = tmp_path / "a" / "b" / "model.bin"
    with atomic_path(target) as tmp:
        assert tmp.parent == target.parent and tmp != target
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new"
    assert oct(target.stat().st_mode & 0o777) == "0o644"
