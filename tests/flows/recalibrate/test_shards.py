"""`cord-ops recalibrate --data 'shards/*/*.parquet' --dask-address ...`: the normal
recalibration flow on a real `dask scheduler` with two `dask worker` processes.

What is checked against an in-memory computation on the same rows (the split rule of
docs/scale.md restated here, shard by shard): the run's split sizes, the calibrator's
parameters and NLL (optimiser tolerance), eta* (to the last bit, against the exact-sum fit
on one in-memory partition; to 1e-10 against ``CORD.fit``), every metric over all
evaluation rows, the prediction-change counts, the sampled metrics and the pinned
reference split (the evaluation sample, row for row), the registered graph (the bytes
``export_onnx`` gives for the fitted pair, and its outputs on every evaluation row), and
the gate with a champion. Bad input fails in one line before anything starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from servers import dask_cluster

from cord_ops import CORD, data, metrics
from cord_ops.calibrators import calibrator_from_dict, make_calibrator
from cord_ops.cord_kernels import row_scalars
from cord_ops.reduce import fit_cord_from_sums, local_reduce
from cord_ops.softmax import softmax

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

K = 10
SHARDS = {"day=1/part-0.parquet": 1400, "day=1/part-1.parquet": 900,
          "day=2/part-0.parquet": 1700, "day=3/part-0.parquet": 1000}  # same basenames
SEED, FRACTION, SAMPLE = 3, 0.4, 700


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(scheduler address, client) of a real scheduler with two workers."""
    from distributed import Client

    with dask_cluster(tmp_path_factory.mktemp("dask")) as (address, _), \
            Client(address, timeout=30) as client:
        yield address, client


def outputs(rng, n):
    z = rng.normal(size=(n, K)) * 3.0
    noisy = softmax(0.45 * z + 0.8 * rng.normal(size=(n, K)))
    y = (noisy.cumsum(axis=1) > rng.random((n, 1))).argmax(axis=1)
    return z.astype(np.float32), y


def write_shards(root: Path, sizes: dict[str, int], seed: int) -> Path:
    rng = np.random.default_rng(seed)
    for name, n in sizes.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        data.save_parquet(root / name, *outputs(rng, n), "logits")
    return root


def split_in_memory(root: Path, fraction: float, seed: int = SEED):
    """(calibration (z, y), evaluation (z, y, key)) by the documented rule: per shard,
    rng = default_rng([seed, first 8 bytes of sha256(relative path), little-endian]),
    u = rng.random(n) then v = rng.random(n); calibration where u < fraction."""
    cal, ev = [], []
    for path in sorted(root.rglob("*.parquet")):
        shard = data.load_parquet(path)
        rel = path.relative_to(root).as_posix().encode()
        key = int.from_bytes(hashlib.sha256(rel).digest()[:8], "little")
        rng = np.random.default_rng([seed, key])
        u, v = rng.random(shard.n), rng.random(shard.n)
        pick = u < fraction
        cal.append((shard.scores[pick], shard.labels[pick]))
        ev.append((shard.scores[~pick], shard.labels[~pick], v[~pick]))
    cal = tuple(np.concatenate(c) for c in zip(*cal, strict=True))
    ev = tuple(np.concatenate(c) for c in zip(*ev, strict=True))
    return cal, ev


def artifact_json(client, run_id: str, path: str, tmp: Path) -> dict:
    return json.loads(Path(client.download_artifacts(run_id, path, str(tmp))).read_text())


def scratch_left(client) -> list[str]:
    """Scratch files of any session still on the workers (they are deleted on close)."""
    found = client.run(lambda dask_worker: [str(p) for p in Path(
        dask_worker.local_directory).glob("cord-ops-*/*")])
    return sorted(p for paths in found.values() for p in paths)


def run_cli(args: list[str]) -> None:
    from flows.cli import main as cli

    assert cli.main(["recalibrate", *args]) == 0


def test_recalibrate_on_shards_logs_the_contract_of_in_memory_rows(cluster, store, tmp_path):
    import onnxruntime as ort
    from mlflow import MlflowClient

    from flows.store import reference, tracking
    from onnx_export import export_onnx

    address, dask_client = cluster
    root = write_shards(tmp_path / "shards", SHARDS, 1)
    run_cli(["--data", str(root / "*" / "*.parquet"), "--dask-address", address,
             "--calibrator", "vs", "--seed", str(SEED), "--fraction", str(FRACTION),
             "--eval-sample", str(SAMPLE), "--model-name", "shards", "--tracking-uri", store])
    client = MlflowClient(store)
    version = client.get_model_version_by_alias("shards", "champion")
    run = client.get_run(version.run_id)
    params, logged, tags = run.data.params, run.data.metrics, run.data.tags
    (zc, yc), (ze, ye, keys) = split_in_memory(root, FRACTION)
    n = sum(SHARDS.values())
    assert (params["n_calibration"], params["n_evaluation"]) == (str(len(yc)), str(len(ye)))
    assert len(yc) + len(ye) == n and params["n_evaluation_sample"] == str(SAMPLE)
    assert tags["data.shape"] == f"{n}x{K}" and params["n_shards"] == str(len(SHARDS))
    lines = "".join(f"{name} {hashlib.sha256((root / name).read_bytes()).hexdigest()}\n"
                    for name in sorted(SHARDS))
    assert tags["data.sha256"] == hashlib.sha256(lines.encode()).hexdigest()

    # calibrator: the in-memory fit on the same calibration rows, to optimiser tolerance
    state = artifact_json(client, run.info.run_id, "state/calibrator.json", tmp_path)
    vs = calibrator_from_dict(state)
    ref = make_calibrator("vs").fit(zc, yc)
    np.testing.assert_allclose(vs.weights_, ref.weights_, atol=1e-4)
    nll, ref_nll = (metrics.nll(c.predict_proba(zc), yc) for c in (vs, ref))
    assert abs(nll - ref_nll) <= 1e-9 * ref_nll
    # eta*: exact sums over one in-memory partition give the same bits as 4 shards on 2
    # workers; numpy's pairwise means (CORD.fit) agree to a few ulps
    p0, q = softmax(zc), vs.predict_proba(zc)
    eta = float(params["eta_star"])
    b, lower, g = row_scalars(p0, q, CORD().local_weight)
    exact = fit_cord_from_sums(local_reduce([{"b": b, "lower": lower, "g": g}]), len(yc), K)
    assert eta.hex() == exact.eta_.hex() and eta == logged["eta_star"]
    assert abs(eta - CORD().fit(p0, q).eta_) <= 1e-10 * abs(eta) and eta != 0.0

    # metrics over every evaluation row
    u, c = softmax(ze), vs.predict_proba(ze)
    repair = CORD.from_dict(artifact_json(client, run.info.run_id, "state/cord.json", tmp_path))
    r = repair.transform(u, c)
    for report, probs in (("uncal", u), ("base", c), ("cord", r)):
        for name, fn in (("nll", metrics.nll), ("brier", metrics.brier)):
            assert logged[f"{report}.{name}"] == pytest.approx(fn(probs, ye), rel=1e-12)
        assert logged[f"{report}.ece"] == pytest.approx(metrics.ece(probs, ye), abs=1e-12)
        assert logged[f"{report}.accuracy"] == metrics.accuracy(probs, ye)
    assert logged["base.tpcr"] == metrics.tpcr(u, c) > 0 and logged["cord.tpcr"] == 0.0
    for name, count in metrics.prediction_changes(u, c, ye).items():
        assert logged[f"base.{name}"] == count
    # the sample: the SAMPLE evaluation rows of smallest key; sampled metrics and the
    # pinned reference split are exactly those rows
    order = np.argsort(keys, kind="stable")[:SAMPLE]
    pinned = reference.load_reference_split(client, run.info.run_id)
    np.testing.assert_array_equal(pinned.scores, ze[order])
    np.testing.assert_array_equal(pinned.labels, ye[order])
    assert logged["cord.smece"] == metrics.smece(r[order], ye[order])
    assert logged["base.ece_em"] == metrics.ece_em(c[order], ye[order])

    # the registered graph: export_onnx's bytes for the fitted pair; parity on every row
    folder = tracking.download(store, "models:/shards/1", tmp_path / "g")
    (graph_path,) = folder.rglob("*.onnx")
    assert graph_path.read_bytes() == export_onnx(
        vs, repair, K, input_kind="logits", dtype="float32").SerializeToString()
    session = ort.InferenceSession(str(graph_path), providers=["CPUExecutionProvider"])
    (out,) = session.run(["repaired"], {"scores": ze.astype(np.float32)})
    assert np.max(np.abs(out - r)) < 1e-5
    assert np.array_equal(out.argmax(axis=1), u.argmax(axis=1))
    # the work ran on both workers and nothing was left on them
    ran = dask_client.run(lambda dask_worker: sum("load_split_shard" in str(entry)
                                                  for entry in dask_worker.state.log))
    assert len(ran) == 2 and all(count > 0 for count in ran.values()), ran
    held = dask_client.run(lambda dask_worker: len(dask_worker.data))
    assert set(held.values()) == {0}, held
    assert scratch_left(dask_client) == []

    # a second run (the folder as --data, one file as --eval-data) meets the champion
    evaluation = write_shards(tmp_path / "holdout", {"all.parquet": 2300}, 2)
    run_cli(["--data", str(root), "--eval-data", str(evaluation / "all.parquet"),
             "--dask-address", address, "--calibrator", "ts", "--eval-sample", "1000",
             "--model-name", "shards", "--tracking-uri", store])
    second = client.get_model_version("shards", "2")
    params = client.get_run(second.run_id).data.params
    assert (params["n_calibration"], params["n_evaluation"]) == (str(n), "2300")
    assert second.tags["cord.gate.reference_version"] == "1"
    assert second.tags["cord.gate.reference_problem"] == "none"
    all_z = np.concatenate([data.load_parquet(root / name).scores for name in sorted(SHARDS)])
    all_y = np.concatenate([data.load_parquet(root / name).labels for name in sorted(SHARDS)])
    ts = calibrator_from_dict(artifact_json(client, second.run_id, "state/calibrator.json",
                                            tmp_path / "ts"))
    ref_beta = make_calibrator("ts").fit(all_z, all_y).beta_
    assert abs(ts.beta_ - ref_beta) <= 1e-10 * ref_beta


def assert_refused(command: list[str], args: list[str], cwd: Path, *fragments: str) -> None:
    """One `error:` line, exit 1, fast, and no store or Prefect server behind it. Shards
    take ts or vs only: ``--calibrator vs`` unless ``args`` name one."""
    if "--calibrator" not in args:
        args = ["--calibrator", "vs", *args]
    home = cwd / "prefect-home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    env["PREFECT_HOME"] = str(home)
    start = time.perf_counter()
    done = subprocess.run([*command, "recalibrate", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - start
    output = (done.stdout + done.stderr).strip()
    last = output.splitlines()[-1]
    assert done.returncode == 1 and last.startswith("error: "), output[-2000:]
    for fragment in fragments:
        assert fragment in last, last
    assert "Traceback" not in output
    assert list(home.iterdir()) == [] and not (cwd / "mlruns").exists()
    assert wall < 30, f"{wall:.1f} s: {last}"


def test_bad_shard_input_is_refused_before_anything_starts(tmp_path, cord_ops_command):
    import socket

    import pyarrow as pa
    import pyarrow.parquet as pq

    root = write_shards(tmp_path / "shards", {"a.parquet": 300, "b.parquet": 300}, 5)
    glob = str(root / "*.parquet")
    assert_refused(cord_ops_command, ["--data", glob, "--calibrator", "irova"], tmp_path,
                   "--calibrator irova: cannot be fitted on shards", "expected one of ts, vs")
    assert_refused(cord_ops_command, ["--data", glob, "--calibrator", "auto"], tmp_path,
                   "--calibrator auto (the default): not supported on shards",
                   "name one of ts, vs")
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    assert_refused(cord_ops_command, ["--data", glob, "--dask-address",
                                      f"tcp://127.0.0.1:{port}"], tmp_path,
                   f"--dask-address tcp://127.0.0.1:{port}: no Dask scheduler answers")
    assert_refused(cord_ops_command, ["--data", glob, "--dask-address", "scheduler"],
                   tmp_path, "expected a Dask scheduler address tcp://HOST:PORT")
    assert_refused(cord_ops_command, ["--data", str(tmp_path / "none" / "*.parquet")],
                   tmp_path, "matches no .parquet/.pq file")
    (root / "c.parquet").write_bytes(b"PAR1 truncated")
    assert_refused(cord_ops_command, ["--data", glob], tmp_path,
                   "c.parquet: not a readable Parquet file")
    (root / "c.parquet").unlink()
    pq.write_table(pa.table({"logits": list(np.zeros((4, K)))}), root / "c.parquet")
    assert_refused(cord_ops_command, ["--data", glob], tmp_path,
                   "c.parquet: missing column 'labels'")
    z, y = outputs(np.random.default_rng(0), 20)
    data.save_parquet(root / "c.parquet", softmax(z[:, :4].astype(np.float64)), y % 4, "probs")
    assert_refused(cord_ops_command, ["--data", glob], tmp_path,
                   "c.parquet: holds 'probs' scores but")
    data.save_parquet(root / "c.parquet", z[:, :5], y % 5, "logits")
    assert_refused(cord_ops_command, ["--data", glob], tmp_path,
                   "c.parquet: holds 5 classes but", f"holds {K}")
    (root / "c.parquet").unlink()
    assert_refused(cord_ops_command, ["--data", glob, "--min-calibration", "0"], tmp_path,
                   "min_calibration")


def test_a_bad_row_fails_the_load_before_any_run_exists(cluster, store, tmp_path):
    """A value only a full read finds: the load on the workers names the shard and row,
    and no MLflow run or experiment was created."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from mlflow import MlflowClient

    from flows.recalibrate.flow import RecalibrationError, recalibrate

    address, _ = cluster
    root = write_shards(tmp_path / "shards", {"a.parquet": 400, "b.parquet": 400}, 7)
    table = pq.read_table(root / "b.parquet")
    labels = table.column("labels").to_numpy().copy()
    labels[123] = K + 2
    pq.write_table(table.set_column(table.column_names.index("labels"), "labels",
                                    pa.array(labels)), root / "b.parquet")
    with pytest.raises(RecalibrationError,
                       match=r"load_shards.*b\.parquet: column 'labels': row 123"):
        recalibrate(data=str(root), dask_address=address, model_name="bad", calibrator="ts",
                    tracking_uri=store)
    assert MlflowClient(store).get_experiment_by_name("bad") is None
    assert scratch_left(cluster[1]) == []  # the shard read before the bad one is gone too


def test_a_worker_killed_after_the_read_changes_no_bit(tmp_path):
    """kill -9 one of two workers once every shard is read and split: the scheduler
    recomputes that worker's partitions on the other (re-reading its shards), and VS +
    CORD come out with the same bits as on a healthy cluster."""
    import signal

    from distributed import Client

    from flows.shards.fit import fit_calibrator_on, fit_cord_on, fit_shards
    from flows.shards.plan import plan_shards
    from flows.shards.session import open_shard_session

    root = write_shards(tmp_path / "shards", {f"p{i}.parquet": 700 for i in range(6)}, 9)
    (tmp_path / "dask").mkdir()
    with dask_cluster(tmp_path / "dask") as (address, pids), \
            Client(address, timeout=30) as client:
        healthy = fit_shards(str(root), "vs", client=client)
        with open_shard_session(plan_shards(str(root), None, "auto", 0, 1.0),
                          client=client) as session:
            holders = {w for where in session.home.values() if where for w in where}
            assert len(holders) == 2  # both workers hold partitions
            os.kill(pids[0], signal.SIGKILL)
            vs = fit_calibrator_on(session, "vs")
            cord, _, _ = fit_cord_on(session, vs)
        assert len(client.scheduler_info()["workers"]) == 1
    assert [w.hex() for w in vs.weights_] == [w.hex() for w in healthy.calibrator.weights_]
    assert cord.eta_.hex() == healthy.cord.eta_.hex() and cord.eta_ != 0.0
