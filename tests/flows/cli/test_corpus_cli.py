"""Real classifier outputs (tests/corpus.py) through the ``cord-ops`` CLI:
``recalibrate`` (the console script, a subprocess) on a calibration and an evaluation file
as a pipeline writes them (float32 probabilities with exact zeros and ones, top-1 ties of
forest and k-NN votes, rows a float32 rounding off 1), ``predict`` from the registry
(in-process ``main``) and ``serve`` (a subprocess) over HTTP. Every answer keeps the
classifier's top-1 under the paper's tie rule (smallest index attaining the maximum,
computed here with numpy on the stored rows) and matches the numpy pipeline rebuilt from
the run's saved state."""

from __future__ import annotations

import json
import subprocess

import corpus
import httpx
import numpy as np
import pytest
from servers import free_port, running, wait_until_ready

from flows.cli.main import main

pytestmark = pytest.mark.slow

#: (entry, calibrator): a binary forest (5/5 vote ties, exact 0 and 1) with a map that
#: may change the top-1, and 10-class k-NN votes (multiples of 1/5) with vector scaling.
CASES = [("breast_cancer-rf-probs-float32", "irova"), ("digits-knn-probs-float32", "vs")]
ALIAS = "corpus"


def _write(path, entry, split: str):
    np.savez(path, **entry.npz_arrays(split))  # float32 as stored, no re-normalisation
    return path


def _numpy_pipeline(store: str, run_id: str, tmp_path, scores: np.ndarray) -> np.ndarray:
    """The repaired rows cord_ops computes from the run's saved calibrator and CORD."""
    import mlflow.artifacts

    from cord_ops import CORD
    from cord_ops.calibrators import calibrator_from_dict

    folder = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="state",
                                                 dst_path=str(tmp_path / "state"),
                                                 tracking_uri=store)
    with open(f"{folder}/calibrator.json") as f:
        cal = calibrator_from_dict(json.load(f))
    with open(f"{folder}/cord.json") as f:
        cord = CORD.from_dict(json.load(f))
    x = scores.astype(np.float64)
    return cord.transform(x, cal.predict_proba(x))


@pytest.mark.parametrize(("entry_name", "calibrator"), CASES)
def test_real_outputs_through_recalibrate_predict_and_serve(
        entry_name, calibrator, store, cli_env, cord_ops_command, tmp_path):
    from mlflow import MlflowClient

    e = corpus.entry(entry_name)
    assert e.has("top1_tie", "exact_zero", "exact_one", "off_simplex")  # what is under test
    cal_file, eval_file = _write(tmp_path / "cal.npz", e, "cal"), _write(
        tmp_path / "eval.npz", e, "eval")
    model = f"corpus-{e.model}"

    def cli(*args):
        done = subprocess.run([*cord_ops_command, *args], cwd=tmp_path, env=cli_env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
        return done

    cli("recalibrate", "--data", str(cal_file), "--eval-data", str(eval_file),
        "--calibrator", calibrator, "--model-name", model)
    client = MlflowClient(store)
    [version] = client.search_model_versions(f"name = '{model}'")
    # An alias of the test's own, so predict and serve run this version whatever the
    # gate decided about @champion (that decision is tests/flows/promotion/test_rules.py's).
    client.set_registered_model_alias(model, ALIAS, version.version)
    run = client.get_run(version.run_id)
    assert run.data.metrics["cord.tpcr"] == 0.0
    assert run.data.metrics["onnx.argmax_agreement"] == 1.0

    scores = e.eval_scores
    top = corpus.top1(scores.astype(np.float64))
    expected = _numpy_pipeline(store, version.run_id, tmp_path, scores)
    np.testing.assert_array_equal(corpus.top1(expected), top)

    # predict in-process (the same parser and code as the console script; one interpreter
    # start fewer): the test's MLFLOW_TRACKING_URI names the store.
    assert main(["predict", "--model", f"models:/{model}@{ALIAS}", "--input", str(eval_file),
                 "--output", str(tmp_path / "out.npz")]) == 0
    with np.load(tmp_path / "out.npz", allow_pickle=False) as out:
        repaired, label = out["repaired"], out["label"]
    np.testing.assert_array_equal(label, top)
    np.testing.assert_array_equal(corpus.top1(repaired), top)
    np.testing.assert_allclose(repaired, expected, rtol=0, atol=1e-5)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    with running([*cord_ops_command, "serve", "--model-name", model, "--alias", ALIAS,
                  "--port", str(port)], log, env=cli_env) as server:
        wait_until_ready(f"{url}/health", server, log, timeout=90)
        response = httpx.post(f"{url}/invocations", timeout=30.0,
                              content=json.dumps({"inputs": scores.tolist()}).encode(),
                              headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    served = response.json()["predictions"]
    np.testing.assert_array_equal(served["label"], top)
    np.testing.assert_array_equal(corpus.top1(np.asarray(served["repaired"])), top)
    np.testing.assert_allclose(served["repaired"], repaired, rtol=0, atol=1e-6)
