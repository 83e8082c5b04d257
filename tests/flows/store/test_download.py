"""The one artifact download (flows.store.tracking.download, download_from_run): a run's
file, folder or whole artifact tree from the store a command names, whatever
MLFLOW_TRACKING_URI says; serving rebuilds a version's logged state through it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cord_ops import CORD
from cord_ops.calibrators import make_calibrator
from flows.serve.served_model import _logged_state
from flows.store import tracking


@pytest.fixture
def logged_run(store, tmp_path, monkeypatch, digits):
    """(store URI, run id, calibrator, CORD) of a run holding ``state/`` and ``notes.json``,
    with MLFLOW_TRACKING_URI pointing at another, empty store."""
    scores, labels = digits.scores[:400], digits.labels[:400]
    calibrator = make_calibrator("ts").fit(scores, labels)
    e = np.exp(scores - scores.max(axis=1, keepdims=True))
    cord = CORD().fit(e / e.sum(axis=1, keepdims=True), calibrator.predict_proba(scores))
    state = tmp_path / "upload" / "state"
    state.mkdir(parents=True)
    (state / "calibrator.json").write_text(json.dumps(calibrator.to_dict()))
    (state / "cord.json").write_text(json.dumps(cord.to_dict()))
    (tmp_path / "upload" / "notes.json").write_text('{"n": 1}')
    client = tracking.client(store)
    run_id = client.create_run(tracking.experiment_id(client, "downloads")).info.run_id
    client.log_artifacts(run_id, str(tmp_path / "upload"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'other' / 'mlflow.db'}")
    return store, run_id, calibrator, cord


def test_a_file_a_folder_and_all_of_a_run_come_from_the_store_named(logged_run, tmp_path):
    store, run_id, _, _ = logged_run
    notes = tracking.download_from_run(store, run_id, "notes.json", tmp_path / "a")
    assert json.loads(notes.read_text()) == {"n": 1}
    state = tracking.download_from_run(store, run_id, "state", tmp_path / "b")
    assert sorted(p.name for p in state.iterdir()) == ["calibrator.json", "cord.json"]
    everything = tracking.download_from_run(store, run_id, "", tmp_path / "c")
    assert sorted(p.relative_to(everything).as_posix() for p in everything.rglob("*")
                  if p.is_file()) == ["notes.json", "state/calibrator.json", "state/cord.json"]
    assert not (tmp_path / "other").exists()  # the process's default store was never opened


def test_serving_rebuilds_the_logged_state_through_it(logged_run, tmp_path, digits):
    store, run_id, calibrator, cord = logged_run
    rebuilt = _logged_state(store, run_id, tmp_path / "served")
    assert rebuilt is not None
    again, cord_again = rebuilt
    rows = digits.scores[400:500]
    np.testing.assert_array_equal(again.predict_proba(rows), calibrator.predict_proba(rows))
    assert cord_again.to_dict() == cord.to_dict()
    assert _logged_state(store, None, tmp_path / "none") is None
