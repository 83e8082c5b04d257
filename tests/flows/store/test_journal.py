"""Unit tests of the failure journal (flows/store/journal.py): where an entry goes, which entries
a replay takes, and that a replay stops at the first entry the store still refuses.

No tracking store is needed: ``replay``'s ``apply`` is the caller's write to the store, so
the tests pass a function that records what it was given (or fails on a chosen entry).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from flows.store import journal

URI = "sqlite:////stores/a/mlflow.db"
OTHER = "http://tracking.example:5000"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """XDG_CACHE_HOME in the test's folder: the fallback journal lands there."""
    base = tmp_path / "xdg-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(base))
    return base


def _fallback(base: Path, uri: str) -> Path:
    return base / "cord-ops" / "journal" / hashlib.sha256(uri.encode()).hexdigest()[:16]


def _write(folder: Path, name: str, payload) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    return path


def test_cache_folder_is_per_uri_under_xdg_cache_home_or_home(cache, tmp_path, monkeypatch):
    assert journal.cache_folder(URI) == _fallback(cache, URI)
    assert journal.cache_folder(OTHER) == _fallback(cache, OTHER)
    assert journal.cache_folder(URI) != journal.cache_folder(OTHER)
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert journal.cache_folder(URI) == _fallback(tmp_path / "home" / ".cache", URI)
    monkeypatch.setenv("XDG_CACHE_HOME", "")  # set but empty: the default, as XDG says
    assert journal.cache_folder(URI) == _fallback(tmp_path / "home" / ".cache", URI)


def test_folders_prefer_the_store_then_the_cache(cache, tmp_path):
    store = tmp_path / "store"
    assert journal.folders(URI, store) == [store / ".cord-journal", _fallback(cache, URI)]
    assert journal.folders(OTHER, None) == [_fallback(cache, OTHER)]


def test_record_writes_next_to_a_local_store(cache, tmp_path):
    store = tmp_path / "store"
    store.mkdir()

    path = journal.record(URI, store, {"run_id": "r1", "error": "disk full"})

    assert path.parent == store / ".cord-journal"
    # Named by a local timestamp, then a random part: names sort oldest first.
    assert re.fullmatch(r"\d{8}T\d{6}-[0-9a-f]{8}\.json", path.name), path.name
    entry = json.loads(path.read_text())
    assert entry["journal_version"] == journal.VERSION == 1
    assert entry["tracking_uri"] == URI
    assert (entry["run_id"], entry["error"]) == ("r1", "disk full")
    assert isinstance(entry["recorded"], float)
    assert not cache.exists()  # nothing in the fallback
    assert journal.pending(URI, store) == [path]


def test_record_falls_back_to_the_cache_when_the_store_folder_cannot_be_written(
        cache, tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / ".cord-journal").write_text("a file where the folder should be")

    path = journal.record(URI, store, {"run_id": "r1"})

    assert path.parent == _fallback(cache, URI)
    assert json.loads(path.read_text())["run_id"] == "r1"
    assert journal.pending(URI, store) == [path]


def test_record_of_a_remote_store_goes_to_the_cache(cache):
    path = journal.record(OTHER, None, {"run_id": "r2"})
    assert path.parent == _fallback(cache, OTHER)


def test_record_raises_when_no_folder_takes_the_entry(tmp_path, monkeypatch):
    blocked = tmp_path / "blocked"
    blocked.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    store = tmp_path / "store"
    store.mkdir()
    (store / ".cord-journal").write_text("not a folder either")

    with pytest.raises(OSError):
        journal.record(URI, store, {"run_id": "r1"})
    assert (store / ".cord-journal").read_text() == "not a folder either"


def test_two_records_get_two_files(cache):
    first = journal.record(OTHER, None, {"n": 1})
    second = journal.record(OTHER, None, {"n": 2})
    assert first != second
    assert sorted(json.loads(p.read_text())["n"] for p in journal.pending(OTHER, None)) == [1, 2]


def test_pending_takes_both_folders_oldest_first_and_skips_temporaries(cache, tmp_path):
    store = tmp_path / "store"
    local = store / ".cord-journal"
    fallback = _fallback(cache, URI)
    b = _write(local, "20260101T000002-bbbbbbbb.json", {"tracking_uri": URI})
    a = _write(fallback, "20260101T000001-aaaaaaaa.json", {"tracking_uri": URI})
    c = _write(fallback, "20260101T000003-cccccccc.json", {"tracking_uri": URI})
    _write(local, ".20260101T000000-x.json.123.tmp", "{")  # a writer's temporary
    _write(local, ".20260101T000000-hidden.json", {"tracking_uri": URI})
    _write(local, "notes.txt", "not an entry")

    assert journal.pending(URI, store) == [a, b, c]
    assert journal.pending(URI, tmp_path / "no-such-store") == [a, c]
    assert journal.pending(OTHER, None) == []


def test_replay_applies_in_order_deletes_what_it_applied_and_leaves_other_stores(
        cache, tmp_path):
    store = tmp_path / "store"
    local = store / ".cord-journal"
    first = _write(local, "20260101T000001-a.json", {"tracking_uri": URI, "n": 1})
    other = _write(local, "20260101T000002-b.json", {"tracking_uri": OTHER, "n": 2})
    broken = _write(local, "20260101T000003-c.json", "{not json")
    last = _write(_fallback(cache, URI), "20260101T000004-d.json",
                  {"tracking_uri": URI, "n": 4})
    applied = []

    done = journal.replay(URI, store, applied.append)

    assert [e["n"] for e in applied] == [1, 4]
    assert all(e["tracking_uri"] == URI for e in applied)
    assert done == [first, last]
    assert not first.exists() and not last.exists()
    assert other.exists() and broken.exists()  # not ours: left for their store / a person
    assert journal.replay(URI, store, applied.append) == []
    assert len(applied) == 2


def test_replay_stops_at_the_first_entry_that_fails_and_keeps_it(cache):
    folder = _fallback(cache, OTHER)
    paths = [_write(folder, f"20260101T00000{i}-e.json", {"tracking_uri": OTHER, "n": i})
             for i in range(1, 4)]
    tried = []

    def apply(entry):
        tried.append(entry["n"])
        if entry["n"] == 2:
            raise ConnectionError("store still down")

    with pytest.raises(ConnectionError, match="still down"):
        journal.replay(OTHER, None, apply)

    assert tried == [1, 2]  # the third was not tried
    assert [p.exists() for p in paths] == [False, True, True]
    assert journal.replay(OTHER, None, lambda entry: tried.append(entry["n"])) == paths[1:]
    assert tried == [1, 2, 2, 3]
    assert journal.pending(OTHER, None) == []


def test_replay_tolerates_an_entry_another_replayer_already_removed(cache):
    """Two commands replaying at once: the other one may delete a file first."""
    folder = _fallback(cache, OTHER)
    path = _write(folder, "20260101T000001-e.json", {"tracking_uri": OTHER, "n": 1})

    def apply(entry):
        path.unlink()  # the other replayer applied and removed it meanwhile

    assert journal.replay(OTHER, None, apply) == [path]
    assert journal.pending(OTHER, None) == []
