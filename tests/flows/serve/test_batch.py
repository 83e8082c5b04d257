"""``cord-ops predict`` over folders and globs of Parquet files on a real Dask cluster: a
``dask scheduler`` and two ``dask worker`` processes on 127.0.0.1, one onnxruntime session
per worker, output partitioned like the input, every row's top-1 kept, and nothing written
when a partition is bad."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from servers import dask_cluster, free_port

from cord_ops import CORD, data
from cord_ops.calibrators import make_calibrator
from flows.cli import main as cli
from flows.serve.batch import predict_batch
from onnx_export import export_onnx, predict_file, save_model

pytestmark = pytest.mark.slow

K = 10


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """`dask scheduler` + two `dask worker` processes; yields (address, [worker PIDs])."""
    with dask_cluster(tmp_path_factory.mktemp("dask-logs")) as found:
        yield found


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    digits = data.digits_dataset(0)
    cal = make_calibrator("vs").fit(digits.scores, digits.labels)
    cord = CORD().fit(digits.probabilities(), cal.predict_proba(digits.scores))
    return save_model(export_onnx(cal, cord, K), tmp_path_factory.mktemp("m") / "m.onnx")


def write_partitions(root: Path, n_files: int, rows: int, seed: int) -> dict[Path, np.ndarray]:
    """Nested Parquet partitions (both score layouts) of logits with near-ties and ids."""
    rng = np.random.default_rng(seed)
    written = {}
    for i in range(n_files):
        scores = rng.normal(0.0, 3.0, (rows, K))
        scores[::7, 1] = scores[::7, 0] + 1e-3  # close top-two gaps where VS flips
        path = root / f"day={i % 3}" / f"part-{i}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        layout = "list" if i % 2 else "columns"
        pq.write_table(pa.table({"id": np.arange(rows) + 10_000 * i,
                                 **data.score_arrays(scores, "logits", layout)}), path)
        written[path] = scores
    return written


def test_folder_on_an_external_cluster_keeps_every_top1(cluster, model_path, tmp_path):
    address, pids = cluster
    inputs = write_partitions(tmp_path / "in", n_files=6, rows=400, seed=1)
    result = predict_batch(model_path, tmp_path / "in", tmp_path / "out",
                           dask_address=address)
    assert result.files == 6 and result.rows == 2400
    # One session per worker: every task on a worker process used the same session object.
    sessions = {}
    for task in result.tasks:
        assert task["pid"] in pids
        sessions.setdefault(task["pid"], set()).add(task["session"])
    assert all(len(ids) == 1 for ids in sessions.values())
    outputs = sorted(p.relative_to(tmp_path / "out") for p in (tmp_path / "out").rglob("*.parquet"))
    assert outputs == sorted(p.relative_to(tmp_path / "in") for p in inputs)
    for source, scores in inputs.items():
        table = pq.read_table(tmp_path / "out" / source.relative_to(tmp_path / "in"))
        label = table.column("label").to_numpy()
        repaired = np.stack(table.column("repaired").to_numpy(zero_copy_only=False))
        assert np.array_equal(label, np.argmax(scores.astype(np.float32), axis=1))
        assert np.array_equal(np.argmax(repaired, axis=1), label)
        assert table.column("id").to_pylist() == pq.read_table(source).column("id").to_pylist()
        # Same numbers as the single-process path on the same file.
        single = tmp_path / "single.parquet"
        predict_file(model_path, source, single, progress=False)
        assert pq.read_table(single).equals(table)
        single.unlink()


def test_cli_glob_and_a_bad_partition(cluster, model_path, tmp_path, capsys):
    address, _ = cluster
    inputs = write_partitions(tmp_path / "in", n_files=4, rows=100, seed=2)
    pattern = str(tmp_path / "in" / "**" / "part-*.parquet")
    assert cli.main(["predict", "--model", str(model_path), "--input", pattern,
                     "--output", str(tmp_path / "out"), "--dask-address", address]) == 0
    assert "wrote 400 rows from 4 files" in capsys.readouterr().out
    assert len(list((tmp_path / "out").rglob("*.parquet"))) == len(inputs)

    # A NaN deep in one partition: found by a worker, reported with file and row, and the
    # partitions already written are removed with their folder.
    bad = sorted(inputs)[2]
    scores = inputs[bad].copy()
    scores[37, 4] = np.nan
    pq.write_table(pa.table({"id": np.arange(100), "logits": list(scores)}), bad)
    assert cli.main(["predict", "--model", str(model_path), "--input", pattern,
                     "--output", str(tmp_path / "out2"), "--dask-address", address]) == 1
    err = capsys.readouterr().err
    assert f"{bad}: logits: row 37 contains NaN or inf" in err
    assert not (tmp_path / "out2").exists()
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_schema_problems_are_refused_before_the_cluster_is_contacted(model_path, tmp_path):
    write_partitions(tmp_path / "in", n_files=2, rows=10, seed=3)
    pq.write_table(pa.table({"id": [1, 2], "scores": [[0.0] * K] * 2}),
                   tmp_path / "in" / "zz.parquet")
    # Nothing listens on this port: a refusal that names the file proves the order.
    with pytest.raises(ValueError, match=r"zz\.parquet: holds neither of 'logits' and 'probs'"):
        predict_batch(model_path, tmp_path / "in", tmp_path / "out",
                      dask_address=f"tcp://127.0.0.1:{free_port()}")
    with pytest.raises(ValueError, match="matches no .parquet"):
        predict_batch(model_path, str(tmp_path / "nothing-*.parquet"), tmp_path / "out")
    (tmp_path / "out").mkdir()
    with pytest.raises(ValueError, match="already exists"):
        predict_batch(model_path, tmp_path / "in", tmp_path / "out")


def test_partial_folders_of_dead_clients_are_swept_and_live_ones_kept(cluster, model_path,
                                                                      tmp_path):
    """A client killed with kill -9 leaves its partial folder; the next job removes it (its
    owner is dead) but never the folder of a client that still runs."""
    import json

    import psutil

    from flows.serve.batch import OWNER_FILE
    from flows.store.owner import Owner

    address, _ = cluster
    write_partitions(tmp_path / "in", n_files=2, rows=50, seed=5)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = Owner(Owner.current().host, sleeper.pid, psutil.Process(sleeper.pid).create_time())
    sleeper.kill()
    sleeper.wait()
    for name, owner in (("dead", dead), ("live", Owner.current())):
        folder = tmp_path / f"out.partial-{name}"
        (folder / "day=0").mkdir(parents=True)
        (folder / "day=0" / "part-0.parquet").write_bytes(b"half-written")
        (folder / OWNER_FILE).write_text(json.dumps(owner.record()))
    predict_batch(model_path, tmp_path / "in", tmp_path / "out", dask_address=address)
    assert not (tmp_path / "out.partial-dead").exists()
    assert (tmp_path / "out.partial-live" / "day=0" / "part-0.parquet").exists()
    assert not (tmp_path / "out" / OWNER_FILE).exists()


def test_a_worker_killed_mid_job_does_not_lose_a_partition(cluster, model_path, tmp_path):
    """kill -9 one of the two workers while files are being scored: the scheduler moves its
    tasks to the survivor, and every partition is written once, correctly. (Runs last in
    this module: it leaves the cluster with one worker.)"""
    address, pids = cluster
    inputs = write_partitions(tmp_path / "in", n_files=16, rows=8_000, seed=4)
    victim = pids[1]
    killed = threading.Event()

    def kill_when_work_started():
        while not killed.is_set():
            partial = [p for p in tmp_path.iterdir() if ".partial-" in p.name]
            if partial and any(partial[0].rglob("*.parquet")):
                os.kill(victim, signal.SIGKILL)
                killed.set()
            time.sleep(0.005)

    watcher = threading.Thread(target=kill_when_work_started, daemon=True)
    watcher.start()
    started = time.perf_counter()
    result = predict_batch(model_path, tmp_path / "in", tmp_path / "out", dask_address=address)
    elapsed = time.perf_counter() - started
    was_killed_mid_job = killed.is_set()
    killed.set()
    watcher.join(timeout=5)
    assert was_killed_mid_job, f"the job ({elapsed:.1f} s) ended before the kill"
    assert result.files == 16 and result.rows == 16 * 8_000
    assert {t["pid"] for t in result.tasks} <= set(pids)
    for source, scores in inputs.items():
        table = pq.read_table(tmp_path / "out" / source.relative_to(tmp_path / "in"),
                              columns=["label"])
        assert np.array_equal(table.column("label").to_numpy(),
                              np.argmax(scores.astype(np.float32), axis=1))
