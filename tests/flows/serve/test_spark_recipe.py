"""The documented Spark recipe (docs/batch-scoring.md), run as written: a folder of Parquet
partitions read by a local Spark session, scored by ``mlflow.pyfunc.spark_udf`` on the
registered model, written back as Parquet; every output row keeps its input's top-1."""

from __future__ import annotations

import os
import shutil
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy.special import softmax

from cord_ops import CORD
from cord_ops.calibrators import make_calibrator
from flows import pyfunc_model
from flows.store import registry
from onnx_export import export_onnx

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
                       reason="no JDK for a local Spark"),
]


def _register_logits_model(scores: np.ndarray, labels: np.ndarray) -> str:
    """VS + CORD fitted, exported and registered with the pyfunc flavour; returns the URI."""
    from mlflow import MlflowClient

    client = MlflowClient()
    calibrator = make_calibrator("vs").fit(scores, labels)
    cord = CORD().fit(softmax(scores, axis=1), calibrator.predict_proba(scores))
    graph = export_onnx(calibrator, cord, scores.shape[1], dtype="float32")
    experiment = client.create_experiment("spark-recipe")
    run_id = client.create_run(experiment).info.run_id
    info = pyfunc_model.log_model(client, run_id, experiment, graph,
                                  scores[:5].astype(np.float32))
    registry.ensure_registered_model(client, "spark-recipe")
    version = client.create_model_version("spark-recipe", source=info.model_uri,
                                          run_id=run_id, model_id=info.model_id)
    return f"models:/spark-recipe/{version.version}"


def test_parquet_folder_through_spark_udf_keeps_every_top1(store, digits, tmp_path,
                                                            monkeypatch):
    import mlflow.pyfunc
    from pyspark.sql import SparkSession

    model_uri = _register_logits_model(np.asarray(digits.scores), np.asarray(digits.labels))
    scores = np.asarray(digits.scores)
    for i, rows in enumerate(np.array_split(np.arange(len(scores)), 3)):
        folder = tmp_path / "scores" / f"day={i}"
        folder.mkdir(parents=True)
        pq.write_table(pa.table({"id": rows, "logits": list(scores[rows])}),
                       folder / "part-0.parquet")

    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[1]").appName("cord-ops-recipe")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.memory", "512m")
             .config("spark.local.dir", str(tmp_path / "spark-tmp"))
             .getOrCreate())
    try:
        frame = spark.read.parquet(str(tmp_path / "scores"))
        udf = mlflow.pyfunc.spark_udf(
            spark, model_uri, env_manager="local",
            result_type="struct<repaired: array<float>, label: long, confidence: float>")
        scored = frame.withColumn("cord", udf("logits"))
        (scored.select("id", "day", "cord.label", "cord.confidence", "cord.repaired")
               .write.mode("error").parquet(str(tmp_path / "repaired")))
    finally:
        spark.stop()

    out = pq.read_table(tmp_path / "repaired").to_pandas().sort_values("id")
    assert out["id"].tolist() == list(range(len(scores)))
    label = out["label"].to_numpy()
    repaired = np.stack(out["repaired"].to_numpy())
    assert np.array_equal(label, np.argmax(scores.astype(np.float32), axis=1))
    assert np.array_equal(np.argmax(repaired, axis=1), label)
    assert np.allclose(out["confidence"], repaired[np.arange(len(label)), label])
