"""The pinned reference split on a real sqlite store: logged as an MLflow dataset input with
digest and source, found again from the run alone, refused once its bytes change."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cord_ops import data
from flows.store import reference


@pytest.fixture
def client(store):
    from mlflow import MlflowClient

    return MlflowClient(store)


@pytest.fixture
def run_id(client) -> str:
    return client.create_run(client.create_experiment("ref")).info.run_id


def test_reference_split_round_trips_through_the_run(client, run_id, digits):
    split = data.split(digits, 0)[1]
    sha256 = reference.log_reference_split(client, run_id, split)

    (logged,) = client.get_run(run_id).inputs.dataset_inputs
    assert logged.dataset.digest == sha256[:reference.DIGEST_LENGTH]
    assert {(t.key, t.value) for t in logged.tags} == {("mlflow.data.context", "evaluation")}
    assert logged.dataset.source_type == "local"
    source = json.loads(logged.dataset.source)["uri"]
    assert source.endswith("reference/evaluation.npz") and Path(
        source.removeprefix("file://")).exists()
    profile = json.loads(logged.dataset.profile)
    assert profile["label_counts"] == np.bincount(split.labels, minlength=10).tolist()
    assert (profile["rows"], profile["n_classes"], profile["input_kind"]) == (split.n, 10,
                                                                             "logits")

    back = reference.load_reference_split(client, run_id)
    assert np.array_equal(back.scores, split.scores) and np.array_equal(back.labels,
                                                                         split.labels)
    assert back.path == source


def test_a_changed_or_missing_reference_is_unavailable(client, run_id, digits):
    with pytest.raises(reference.ReferenceUnavailable, match="logged no evaluation dataset"):
        reference.load_reference_split(client, run_id)
    reference.log_reference_split(client, run_id, data.split(digits, 0)[1])
    (logged,) = client.get_run(run_id).inputs.dataset_inputs
    stored = Path(json.loads(logged.dataset.source)["uri"].removeprefix("file://"))

    # Same shape, one label changed: a valid file that is not what was gated.
    labels = np.array(data.load_npz(stored).labels)
    labels[0] = (labels[0] + 1) % 10
    data.save_npz(stored, data.load_npz(stored).scores, labels, "logits")
    with pytest.raises(reference.ReferenceUnavailable, match="does not match the one logged"):
        reference.load_reference_split(client, run_id)
    stored.unlink()
    with pytest.raises(reference.ReferenceUnavailable, match="cannot be downloaded"):
        reference.load_reference_split(client, run_id)


PIN_AT_ONCE = """
import sys, time
from mlflow import MlflowClient
from mlflow.entities import Dataset, DatasetInput, InputTag
from flows.store import reference
uri, run_id, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
client = MlflowClient(uri)
# What log_reference_split records, for one split shared by every run.
pinned = DatasetInput(Dataset(name=reference.DATASET_NAME, digest="c09a9f694ccb41e0",
                              source_type="local", source='{"uri": "same-split.npz"}'),
                      [InputTag(reference.CONTEXT_TAG, reference.CONTEXT)])
while time.time() < start:
    pass
reference._log_input(client, run_id, pinned)
"""


def test_runs_pinning_the_same_split_at_once_all_succeed(tmp_path):
    """MLflow inserts a dataset row without a lock; eight runs pinning the same split at the
    same moment race on its unique key. Every one of them must still record its input."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    from mlflow import MlflowClient

    import cord_ops
    from flows.store import tracking

    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    tracking.prepare_store(uri)
    client = MlflowClient(uri)
    experiment = client.create_experiment("pins")
    runs = [client.create_run(experiment).info.run_id for _ in range(8)]
    env = {**os.environ, "PYTHONPATH": str(Path(cord_ops.__file__).resolve().parents[1])}
    start = time.time() + 15  # every process imported and waiting before the first insert
    processes = [subprocess.Popen([sys.executable, "-c", PIN_AT_ONCE, uri, run, str(start)],
                                  env=env, stderr=subprocess.PIPE, text=True) for run in runs]
    errors = [p.communicate(timeout=300)[1] for p in processes]
    assert [p.returncode for p in processes] == [0] * 8, [e[-800:] for e in errors]
    for run in runs:
        assert reference.reference_input(client, run) is not None


@pytest.mark.parametrize(("uri", "expected"), [
    ("s3://bucket/1/r/artifacts/reference/evaluation.npz",
     ("s3", {"uri": "s3://bucket/1/r/artifacts/reference/evaluation.npz"})),
    ("https://host/reference/evaluation.npz",
     ("http", {"url": "https://host/reference/evaluation.npz"})),
    # a scheme MLflow's resolver does not take keeps the URI and the run
    ("mlflow-artifacts:/1/r/artifacts/reference/evaluation.npz",
     ("mlflow-artifact", {"uri": "mlflow-artifacts:/1/r/artifacts/reference/evaluation.npz",
                          "run_id": "r"})),
])
def test_the_reference_source_is_typed_as_mlflow_resolves_the_artifact_uri(uri, expected):
    source_type, source = reference._source(uri, "r")
    assert (source_type, json.loads(source)) == expected
