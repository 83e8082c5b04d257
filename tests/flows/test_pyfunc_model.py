"""The registered model's pyfunc flavour as its users meet it: ``mlflow.pyfunc.load_model``,
a real ``mlflow models serve`` process, ``mlflow.pyfunc.spark_udf`` on a local Spark, and
the bare ``.onnx`` file with onnxruntime."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest
from scipy.special import softmax
from servers import free_port, running, wait_until_ready

from cord_ops import CORD
from cord_ops.calibrators import make_calibrator
from flows import pyfunc_model
from flows.serve.contract import InputContract, ScoringInputError, score_matrix
from flows.store import registry
from onnx_export import export_onnx


def _register(client, name: str, scores: np.ndarray, labels: np.ndarray, input_kind: str,
              dtype: str = "float32") -> str:
    """Fit VS + CORD, export, log with the pyfunc flavour and register; returns the URI."""
    calibrator = make_calibrator("vs", input_kind=input_kind).fit(scores, labels)
    original = softmax(scores, axis=1) if input_kind == "logits" else scores
    cord = CORD().fit(original, calibrator.predict_proba(scores))
    graph = export_onnx(calibrator, cord, scores.shape[1], input_kind=input_kind, dtype=dtype)
    experiment = client.create_experiment(name)
    run_id = client.create_run(experiment).info.run_id
    info = pyfunc_model.log_model(client, run_id, experiment, graph,
                                  scores[:5].astype(dtype))
    registry.ensure_registered_model(client, name)
    version = client.create_model_version(name, source=info.model_uri, run_id=run_id,
                                          model_id=info.model_id)
    return f"models:/{name}/{version.version}"


@pytest.fixture
def logits_model(store, digits) -> str:
    from mlflow import MlflowClient

    return _register(MlflowClient(), "pyfunc-logits", digits.scores, digits.labels, "logits")


def _refusal(model, value) -> str:
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException) as caught:
        model.predict(value)
    assert caught.value.error_code == "INVALID_PARAMETER_VALUE"
    return caught.value.message


def test_pyfunc_accepts_arrays_and_frames_and_refuses_bad_rows(logits_model, digits, store):
    import mlflow.onnx
    import mlflow.pyfunc
    import onnxruntime as ort
    from mlflow import MlflowClient

    model = mlflow.pyfunc.load_model(logits_model)
    rows = digits.scores[:40]
    top1 = np.argmax(rows, axis=1)
    reference = model.predict(rows.astype(np.float32))
    np.testing.assert_array_equal(reference["label"], top1)
    np.testing.assert_array_equal(np.argmax(reference["repaired"], axis=1), top1)
    same_input = {
        "float64 ndarray": rows,
        "K numeric columns": pd.DataFrame(rows, columns=[f"class_{j}" for j in range(10)]),
        "one array column": pd.DataFrame({"scores": list(rows)}),
        "named input": {"scores": rows.astype(np.float32)},
    }
    for form, value in same_input.items():
        out = model.predict(value)
        np.testing.assert_array_equal(out["repaired"], reference["repaired"], err_msg=form)

    contract = InputContract(10, "logits", np.float32)
    bad = rows[:5].copy()
    bad[3, 2] = np.nan
    message = _refusal(model, bad)
    assert "row 3" in message
    with pytest.raises(ScoringInputError) as direct:  # the server's rule gives the same message
        score_matrix(bad, contract)
    assert str(direct.value) in message
    assert "expected 10 classes" in _refusal(model, rows[:, :9])
    assert "row 1" in _refusal(model, pd.DataFrame({"scores": [rows[0], rows[1, :4]]}))

    # The .onnx file stays usable without MLflow or Python glue, and nothing is pickled.
    folder = Path(mlflow.artifacts.download_artifacts(
        MlflowClient().get_model_version_download_uri("pyfunc-logits", "1")))
    assert not [p for p in folder.rglob("*") if p.suffix in (".pkl", ".pickle")]
    session = ort.InferenceSession(str(folder / pyfunc_model.ONNX_PATH_IN_MODEL),
                                   providers=["CPUExecutionProvider"])
    (repaired,) = session.run(["repaired"], {"scores": rows.astype(np.float32)})
    np.testing.assert_array_equal(repaired, reference["repaired"])
    assert mlflow.onnx.load_model(logits_model).graph.input[0].name == "scores"


def test_probability_model_refuses_rows_that_are_not_distributions(store, digits):
    import mlflow.pyfunc
    from mlflow import MlflowClient

    probs = softmax(digits.scores, axis=1)
    uri = _register(MlflowClient(), "pyfunc-probs", probs, digits.labels, "probs",
                    dtype="float64")
    model = mlflow.pyfunc.load_model(uri)
    out = model.predict(probs[:20].astype(np.float32))  # float32 rows: within tolerance
    np.testing.assert_array_equal(out["label"], np.argmax(probs[:20], axis=1))
    scaled = probs[:4].copy()
    scaled[1] *= 1.5
    assert "row 1 sums to" in _refusal(model, scaled)
    negative = probs[:4].copy()
    negative[2, 0] = -0.25
    negative[2, 1] += 0.25
    assert "row 2 has a negative entry" in _refusal(model, negative)


@pytest.mark.slow
def test_mlflow_models_serve_answers_bad_rows_with_400(logits_model, digits, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    log = tmp_path / "mlflow-serve.log"
    with running([str(mlflow_cli), "models", "serve", "-m", logits_model, "--env-manager",
                  "local", "--host", "127.0.0.1", "--port", str(port)], log) as server:
        wait_until_ready(f"{url}/ping", server, log, timeout=120)
        rows = digits.scores[:6]

        def post(payload) -> httpx.Response:
            return httpx.post(f"{url}/invocations", content=json.dumps(payload).encode(),
                              headers={"content-type": "application/json"}, timeout=30)

        split = post({"dataframe_split": {"columns": [f"c{j}" for j in range(10)],
                                          "data": rows.tolist()}})
        assert split.status_code == 200, split.text
        np.testing.assert_array_equal(split.json()["predictions"]["label"],
                                      np.argmax(rows, axis=1))
        records = post({"dataframe_records": [{"scores": row} for row in rows.tolist()]})
        assert records.status_code == 200, records.text
        np.testing.assert_allclose(records.json()["predictions"]["repaired"],
                                   split.json()["predictions"]["repaired"], rtol=0, atol=0)
        instances = post({"instances": rows.tolist()})
        assert instances.status_code == 200, instances.text

        nan_rows = rows.tolist()
        nan_rows[4][1] = float("nan")
        refused = post({"inputs": nan_rows})
        assert refused.status_code == 400, refused.text
        assert "row 4 contains NaN or inf" in refused.json()["message"]
        narrow = post({"inputs": rows[:, :3].tolist()})
        assert narrow.status_code == 400
        assert "expected 10 classes (columns), got 3" in narrow.json()["message"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
                    reason="no JDK for a local Spark")
def test_spark_udf_scores_a_spark_dataframe(logits_model, digits, tmp_path, monkeypatch):
    import mlflow.pyfunc
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    # Spark's Python workers must run this interpreter (and see this checkout).
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[1]").appName("cord-ops-spark-udf")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.memory", "512m")
             .config("spark.sql.shuffle.partitions", "1")
             .config("spark.local.dir", str(tmp_path / "spark"))
             .getOrCreate())
    try:
        rows = digits.scores[:200]
        columns = [f"c{j}" for j in range(10)]
        frame = spark.createDataFrame(
            [(i, [float(v) for v in row], *map(float, row)) for i, row in enumerate(rows)],
            ["id", "scores", *columns])
        udf = mlflow.pyfunc.spark_udf(
            spark, logits_model, env_manager="local",
            result_type="struct<repaired: array<float>, label: long, confidence: float>")
        scored = (frame.withColumn("by_array", udf("scores"))
                  .withColumn("by_columns", udf(*columns))
                  .select("id", "by_array.label", F.col("by_array.repaired").alias("repaired"),
                          F.col("by_columns.label").alias("label_cols"))
                  .orderBy("id").collect())
    finally:
        spark.stop()
    labels = np.array([r["label"] for r in scored])
    repaired = np.array([r["repaired"] for r in scored])
    np.testing.assert_array_equal(labels, np.argmax(rows, axis=1))
    np.testing.assert_array_equal(np.argmax(repaired, axis=1), np.argmax(rows, axis=1))
    np.testing.assert_array_equal([r["label_cols"] for r in scored], labels)
