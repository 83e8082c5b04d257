"""The pinned reference split on a real sqlite store: logged as an MLflow dataset input with
digest and source, found again from the run alone, refused once its bytes change."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cord_ops import data
from flows import reference


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
