"""A binary classifier's outputs as pipelines log them, end to end: float32
probability rows that sum to 1 only to rounding (one top-1 a float32 ulp above 1, which
the report step must take), then the same model scored in the one-score-column form by
``cord-ops predict`` (Parquet), the registered version as cord-ops runs it and
``cord-ops serve``'s app.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flows.recalibrate.flow import recalibrate

pytestmark = pytest.mark.usefixtures("prefect_harness")

EPS32 = float(np.finfo(np.float32).eps)


def _binary_outputs(n: int = 1200, seed: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """An overconfident binary model's positive-class probabilities (float32) and labels."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    margin = 3.0 * ((2 * labels - 1) * rng.uniform(0.2, 1.5, n) + rng.normal(0, 1, n))
    return (1 / (1 + np.exp(-margin))).astype(np.float32), labels


def test_float32_binary_file_recalibrates_and_the_model_takes_one_column(store, tmp_path):
    from mlflow import MlflowClient
    from starlette.testclient import TestClient

    from flows.cli import main as cli
    from flows.serve import app as serve
    from flows.serve.follower import RegistryFollower
    from flows.serve.metrics import Metrics
    from flows.store import registry

    p, labels = _binary_outputs()
    # as a pipeline stores them: 1 - p and p computed in float32, exact 0/1 rows, and one
    # top-1 one ulp above 1 (the row sums to 1 + 1.2e-7)
    rows = np.stack([np.float32(1) - p, p], axis=1)
    rows[:3] = [[0.0, 1.0 + EPS32], [1.0, 0.0], [0.5, 0.5]]
    np.savez(tmp_path / "binary.npz", probs=rows, labels=labels)
    result = recalibrate(data=str(tmp_path / "binary.npz"), model_name="binary",
                         calibrator="ts")
    client = MlflowClient()
    tags = client.get_run(result.run_id).data.tags
    worst = np.abs(rows.astype(np.float64).sum(axis=1) - 1)
    assert tags["data.input_width"] == "2"
    assert float(tags["data.sum_error"]) == worst.max()
    assert any("probability rows renormalised" in note for note in result.input_notes)
    artifacts = {a.path for a in client.list_artifacts(result.run_id, "plots")}
    assert "plots/reliability_uncal.png" in artifacts

    # the one-column form of the same outputs, through predict (Parquet, float32 column)
    column = np.concatenate([[1.0 + 0.0, 0.0, 0.5], p[3:60]]).astype(np.float32)
    pq.write_table(pa.table({"id": np.arange(60), "probs": column}), tmp_path / "one.parquet")
    model = f"models:/binary/{result.version}"
    assert cli.main(["predict", "--model", model, "--input", str(tmp_path / "one.parquet"),
                     "--output", str(tmp_path / "out.parquet")]) == 0
    out = pq.read_table(tmp_path / "out.parquet")
    label = out.column("label").to_numpy()
    assert np.array_equal(label, (column > 0.5).astype(np.int64))  # p = 1/2 ties to class 0
    repaired = np.stack(out.column("repaired").to_numpy(zero_copy_only=False))

    # the registered version run from the registry: one column in, the same answers as two
    two = np.stack([1.0 - column.astype(np.float64), column.astype(np.float64)], axis=1)
    from_one = registry.run_registered_model(client, model, column)
    from_two = registry.run_registered_model(client, model, two)
    assert np.array_equal(from_one["repaired"], from_two["repaired"])
    assert np.abs(from_one["repaired"] - repaired).max() == 0.0
    with pytest.raises(ValueError, match=r"expected 2 classes \(columns\), or one "
                                         r"score column for this binary model, got 3"):
        registry.run_registered_model(client, model, np.full((2, 3), 1 / 3))

    # cord-ops serve's app over the same store (in process, following an alias set here)
    client.set_registered_model_alias("binary", "served", result.version)
    metrics = Metrics()
    follower = RegistryFollower(store, "binary", "served", 0.5, metrics, "cpu")
    with TestClient(serve.build_app(follower, metrics, 0.0, 1000),
                    base_url="http://127.0.0.1") as http:  # a host serve answers
        deadline = time.monotonic() + 60
        while http.get("/health").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        flat = http.post("/invocations", json={"inputs": column[:5].tolist()})
        nested = http.post("/invocations", json={"inputs": column[:5, None].tolist()})
        widths = http.get("/version").json()["input_widths"]
        wide = http.post("/invocations", json={"inputs": [[0.2, 0.3, 0.5]]})
        beyond = http.post("/invocations", json={"inputs": [[0.2, 0.7]]})
    assert flat.status_code == nested.status_code == 200, flat.text
    assert flat.json()["predictions"]["label"] == [1, 0, 0] + list(label[3:5])
    # JSON carries each float32 as its shortest repr, which reads back as the same float32
    assert np.array_equal(np.float32(flat.json()["predictions"]["repaired"]), repaired[:5])
    assert nested.json()["predictions"] == flat.json()["predictions"]
    assert widths == [1, 2]
    assert wide.status_code == 400 and wide.json()["reason"] == "wrong_width"
    assert beyond.status_code == 400 and "row 0 sums to 0.8999" in beyond.json()["error"]


def test_one_column_parquet_shards_are_binary(tmp_path):
    from flows.shards import plan, worker

    folder = tmp_path / "shards"
    folder.mkdir()
    rng = np.random.default_rng(1)
    for i in range(2):
        p = rng.uniform(0, 1, 40).astype(np.float32)
        pq.write_table(pa.table({"probs": p, "labels": (p > 0.5).astype(np.int64)}),
                       folder / f"part-{i}.parquet")
    shards = plan.describe_shards(str(folder))
    assert (shards.n_classes, shards.input_kind, shards.n) == (2, "probs", 80)
    part = worker.load_split_shard(shards.files[0], "probs", 2, 0, 0.5,
                                   shards.key(shards.files[0]), f"binary-{tmp_path.name}")
    try:
        scores = np.asarray(worker.part_scores(part["calibration"]))
        stored = pq.read_table(shards.files[0]).column("probs").to_numpy().astype(np.float64)
        assert scores.shape == (part["calibration"]["n"], 2)
        assert set(scores[:, 1]) <= set(stored)
        assert np.array_equal(scores[:, 0], 1 - scores[:, 1])
    finally:
        worker.remove_scratch(f"binary-{tmp_path.name}")
