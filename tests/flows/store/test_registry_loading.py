"""What cord-ops loads from the registry, on a real sqlite store through the ``cord-ops``
parser in-process: only a version's ONNX graph, checked against the digest its run recorded,
never the code MLflow stores with the model; and one NLL per model and split, whatever
the graph's dtype."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cord_ops import data, metrics
from flows.cli.main import main
from flows.store import graphs, registry

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _client():
    from mlflow import MlflowClient

    return MlflowClient()


def _model_folder(client, name: str, version: str) -> Path:
    source = client.get_model_version(name, version).source  # models:/<logged model id>
    model = client.get_logged_model(source.removeprefix("models:/"))
    return Path(model.artifact_location.removeprefix("file://"))


def _errors(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


@pytest.mark.slow
def test_monitor_and_promote_never_run_the_code_stored_with_a_model(store, tmp_path,
                                                                   digits_file, capsys):
    client = _client()
    args = ["--data", str(digits_file), "--model-name", "m"]
    assert main(["recalibrate", *args]) == 0
    assert main(["recalibrate", *args, "--seed", "1", "--no-promote"]) == 0
    # Whoever may write the registry makes each version's models-from-code entry (what
    # mlflow.pyfunc.load_model executes) leave a mark, and keeps it a working model.
    marker = tmp_path / "ran-stored-code"
    for version in ("1", "2"):
        (code,) = sorted(_model_folder(client, "m", version).rglob("pyfunc_code.py"))
        code.write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
                        + code.read_text())

    assert main(["monitor", *args]) == 0
    assert main(["promote", "--model-name", "m", "--version", "2", "--reason", "seed 1"]) == 0
    assert main(["rollback", "--model-name", "m"]) == 0
    assert main(["status", "--model-name", "m"]) == 0
    assert not marker.exists()
    assert registry.champion_version(client, "m").version in (1, "1")
    # The threat is real: MLflow's own loader runs that code.
    import mlflow.pyfunc

    mlflow.pyfunc.load_model(str(_model_folder(client, "m", "1")))
    assert marker.read_text() == "ran"
    marker.unlink()

    # The graph file gone from the artifact store: one line naming it, nothing run.
    for version in ("1", "2"):
        (_model_folder(client, "m", version) / "artifacts" / "model.onnx").unlink()
    capsys.readouterr()
    assert main(["monitor", *args]) == 1
    (line,) = _errors(capsys)
    assert line.startswith("error: champion v1 of 'm' cannot be scored (v1: its model file "
                           "artifacts/model.onnx is missing from the artifact store"), line
    assert main(["promote", "--model-name", "m", "--version", "2", "--reason", "x"]) == 1
    (line,) = _errors(capsys)
    assert line.startswith("error: v2: its model file artifacts/model.onnx is missing from "
                           "the artifact store"), line
    assert not marker.exists()
    assert registry.champion_version(client, "m").version in (1, "1")


def test_a_graph_that_is_not_the_recorded_file_is_not_loaded(store, digits_file, capsys):
    client = _client()
    assert main(["recalibrate", "--data", str(digits_file), "--model-name", "m",
                 "--no-promote"]) == 0
    graph = _model_folder(client, "m", "1") / "artifacts" / "model.onnx"
    good = graph.read_bytes()
    # Another valid graph of the same model (a metadata entry more): it would load and run.
    import onnx

    changed = onnx.load_model_from_string(good)
    changed.metadata_props.add(key="planted", value="1")
    graph.write_bytes(changed.SerializeToString())
    scores = data.digits_dataset(0).scores[:5]
    with pytest.raises(graphs.GraphRejected, match=r"^v1: its ONNX graph artifacts/model.onnx "
                                                   r"\(sha256 [0-9a-f]{12}\) is not the file "
                                                   r"its run recorded at log time"):
        registry.run_registered_model(client, "models:/m/1", scores)
    assert main(["promote", "--model-name", "m", "--version", "1", "--reason", "x"]) == 1
    assert _errors(capsys)[-1].startswith("error: v1: its ONNX graph artifacts/model.onnx")
    graph.write_bytes(good)
    assert registry.run_registered_model(client, "models:/m/1", scores)["repaired"].shape == (
        5, 10)
    # The run's manifest edited to match the planted graph: refused by the run's tag.
    run_id = client.get_model_version("m", "1").run_id
    manifest = Path(client.get_run(run_id).info.artifact_uri.removeprefix("file://")) / \
        graphs.DIGESTS_ARTIFACT
    manifest.write_text(manifest.read_text() + " ")
    with pytest.raises(graphs.GraphRejected, match=r"^v1: its run's digests.json \(sha256 "
                                                   r"[0-9a-f]{12}\) is not the one recorded"):
        registry.run_registered_model(client, "models:/m/1", scores)


# ---------------------------------------------------------------- one NLL per fact
#: Logit gaps of rows whose label (class 3) the classifier puts far below its top-1 (class
#: 0): after VS + CORD their true-class probability is 4e-13 .. 9e-11 in both dtypes, where
#: the float32 graph's rounding moves it far more, relatively, than the float64 one's.
TINY_GAPS = (55.0, 60.0, 65.0)


def _split_files(folder: Path, digits: data.Dataset) -> tuple[Path, Path, data.Dataset]:
    calibration = data.save_npz(folder / "cal.npz", digits.scores[:450], digits.labels[:450],
                                "logits")
    tiny = np.zeros((len(TINY_GAPS), 10))
    tiny[:, 0] = TINY_GAPS
    scores = np.concatenate([digits.scores[450:], tiny])
    labels = np.concatenate([digits.labels[450:], np.full(len(TINY_GAPS), 3)])
    evaluation = data.save_npz(folder / "eval.npz", scores, labels, "logits")
    return calibration, evaluation, data.load(evaluation)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_summary_gate_run_and_promote_give_one_nll(store, tmp_path, digits, capsys, dtype):
    client = _client()
    calibration, evaluation, split = _split_files(tmp_path, digits)
    assert main(["recalibrate", "--data", str(calibration), "--eval-data", str(evaluation),
                 "--calibrator", "vs", "--dtype", dtype, "--model-name", "m",
                 "--no-promote"]) == 0
    out = capsys.readouterr().out
    mv = client.get_model_version("m", "1")
    run = client.get_run(mv.run_id)
    logged = run.data.metrics["cord.nll"]

    # The rows below 1e-10: the served graph's true-class probability, in this dtype.
    served = registry.run_registered_model(client, "models:/m/1", split.scores)
    true_mass = served["repaired"][np.arange(split.n), split.labels].astype(np.float64)
    tiny = true_mass[-len(TINY_GAPS):]
    assert ((tiny > 1e-15) & (tiny < 1e-10)).all(), tiny
    assert metrics.nll(served["repaired"].astype(np.float64), split.labels) == logged

    # the gate's record of the candidate, the summary table's cord row, the gate line
    assert float(mv.tags[registry.CANDIDATE_NLL_TAG]) == logged
    (row,) = [line for line in out.splitlines() if line.startswith("cord ")]
    assert row.split()[2] == f"{logged:.5f}", row
    assert f"candidate NLL {logged:.6g}," in out
    # promote's check (by digest) accepts it and reports the same figure
    assert main(["promote", "--model-name", "m", "--version", "1", "--reason", "first"]) == 0
    promoted = capsys.readouterr().out
    assert f"NLL:      {logged:.6g} on v1's reference split" in promoted, promoted
