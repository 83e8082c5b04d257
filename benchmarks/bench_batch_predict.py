"""Rows per second of batch scoring at K = 100: Parquet partitions scored by one process
(one onnxruntime session, files one after another), by ``cord-ops predict`` on a Dask
cluster of 1 and 2 local worker processes, and (``--spark``) by ``mlflow.pyfunc.spark_udf``
on a local Spark session (``local[2]``) reading and writing the same Parquet files.

    python benchmarks/bench_batch_predict.py [--files 8] [--rows 25000] [--classes 100]
                                             [--spark]

The Spark figure includes reading, the UDF (the registered model's pyfunc flavour, logged
to a temporary MLflow store) and writing; not the session's start-up or the model's
download, which happen before the timed run.

Each configuration reads every file, scores it (VS + CORD float32 graph, one intra-op
thread per session) and writes the Parquet output; the Dask figures include the client's
schema check, plugin registration (one session per worker) and the final rename, but not
the cluster's start-up, which is printed separately. Best of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cord_ops import CORD, data  # noqa: E402
from cord_ops.calibrators import ConvergenceWarning, make_calibrator  # noqa: E402
from cord_ops.softmax import softmax  # noqa: E402
from onnx_export import export_onnx, open_session, run_batched, save_model  # noqa: E402
from onnx_export.predict import read_parquet_input, write_outputs  # noqa: E402
from onnx_export.runtime import input_dtype  # noqa: E402


def synthetic_logits(n: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 2.0, (n, k))
    logits[np.arange(n), rng.integers(0, k, n)] += rng.uniform(2.0, 9.0, n)
    return logits


def build(folder: Path, files: int, rows: int, k: int) -> Path:
    z = synthetic_logits(3000, k, seed=1)
    labels = np.argmax(z + np.random.default_rng(2).gumbel(size=z.shape), axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        cal = make_calibrator("vs", max_iter=100).fit(z, labels)
    cord = CORD().fit(softmax(z), cal.predict_proba(z))
    model = save_model(export_onnx(cal, cord, k), folder / "m.onnx")
    import pyarrow as pa
    import pyarrow.parquet as pq

    for i in range(files):
        scores = synthetic_logits(rows, k, seed=10 + i).astype(np.float32)
        pq.write_table(pa.table({"id": np.arange(rows),
                                 **data.score_arrays(scores, "logits")}),
                       folder / "in" / f"part-{i:03d}.parquet")
    return model


def single_process(model: Path, inputs: list[Path], out: Path, k: int) -> None:
    session = open_session(model, provider="cpu", threads=1)
    for source in inputs:
        scores, passthrough = read_parquet_input(source, k, "logits", input_dtype(session))
        outputs = run_batched(session, scores,
                              outputs=["repaired", "calibrated", "label", "confidence"])
        write_outputs(out / source.name, outputs, passthrough)


def spark_seconds(folder: Path, model_path: Path, repeats: int) -> float:
    """Best time of spark_udf over the Parquet folder (docs/batch-scoring.md's recipe)."""
    import os

    import mlflow.pyfunc
    from mlflow import MlflowClient
    from pyspark.sql import SparkSession

    from flows import pyfunc_model
    from flows.store import registry
    from onnx_export import load_model

    uri = f"sqlite:///{folder / 'mlflow.db'}"
    os.environ["MLFLOW_TRACKING_URI"] = uri  # spark_udf downloads through the default client
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    client = MlflowClient(uri)
    experiment = client.create_experiment("bench", artifact_location=str(folder / "art"))
    run_id = client.create_run(experiment).info.run_id
    graph = load_model(model_path)
    k = int(graph.graph.input[0].type.tensor_type.shape.dim[1].dim_value)
    info = pyfunc_model.log_model(client, run_id, experiment, graph,
                                  synthetic_logits(5, k, 0).astype(np.float32))
    registry.ensure_registered_model(client, "bench")
    client.create_model_version("bench", source=info.model_uri, run_id=run_id,
                                model_id=info.model_id)
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.local.dir", str(folder / "spark-tmp")).getOrCreate())
    try:
        udf = mlflow.pyfunc.spark_udf(
            spark, "models:/bench/1", env_manager="local",
            result_type="struct<repaired: array<float>, label: long, confidence: float>")
        best = np.inf
        for r in range(repeats + 1):
            t0 = time.perf_counter()
            (spark.read.parquet(str(folder / "in")).withColumn("cord", udf("logits"))
             .select("id", "cord.label", "cord.confidence", "cord.repaired")
             .write.mode("error").parquet(str(folder / f"spark-{r}")))
            if r:  # the first run starts the Python workers
                best = min(best, time.perf_counter() - t0)
    finally:
        spark.stop()
    return best


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rows", type=int, default=25_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--spark", action="store_true", help="also time spark_udf")
    args = parser.parse_args(argv)
    from distributed import LocalCluster

    from flows.serve.batch import predict_batch

    total = args.files * args.rows
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        folder = Path(tmp)
        (folder / "in").mkdir()
        model = build(folder, args.files, args.rows, args.classes)
        inputs = sorted((folder / "in").glob("*.parquet"))
        results = {}
        best = np.inf
        for _ in range(args.repeats):
            out = folder / "single"
            out.mkdir()
            t0 = time.perf_counter()
            single_process(model, inputs, out, args.classes)
            best = min(best, time.perf_counter() - t0)
            shutil.rmtree(out)
        results["single process"] = best
        startup = {}
        for workers in (1, 2):
            t0 = time.perf_counter()
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                   dashboard_address=None)
            startup[workers] = time.perf_counter() - t0
            try:
                best = np.inf
                for r in range(args.repeats + 1):  # the first run warms the workers' imports
                    out = folder / f"dask{workers}-{r}"
                    t0 = time.perf_counter()
                    predict_batch(model, folder / "in", out,
                                  dask_address=cluster.scheduler_address)
                    if r:
                        best = min(best, time.perf_counter() - t0)
                    shutil.rmtree(out)
                results[f"dask, {workers} worker{'s' if workers > 1 else ''}"] = best
            finally:
                cluster.close()
        if args.spark:
            results["spark_udf, local[2]"] = spark_seconds(folder, model, args.repeats)
    print(f"batch scoring, K = {args.classes}, {args.files} Parquet files x {args.rows:,} rows "
          f"= {total:,} rows, VS + CORD float32, one thread per session")
    for name, seconds in results.items():
        print(f"{name:<20}{seconds:>8.2f} s{total / seconds:>14,.0f} rows/s")
    print("cluster start-up: " + ", ".join(f"{w} worker(s) {s:.1f} s"
                                          for w, s in startup.items()))


if __name__ == "__main__":
    main()
