"""Saving/loading models, onnxruntime sessions and ``predict_file``: streamed batches,
validation of the whole input before anything runs, and no partial output file."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from onnx_export import (
    export_onnx,
    load_model,
    model_metadata,
    open_session,
    predict_file,
    run_batched,
    save_model,
)
from onnx_export import predict as predict_module


@pytest.fixture(scope="module")
def saved_model(cases, tmp_path_factory):
    cal, cord = cases.fitted("vs", 10, "logits")
    path = save_model(export_onnx(cal, cord, 10), tmp_path_factory.mktemp("model") / "m.onnx")
    return cal, cord, path


@pytest.fixture
def logits_file(cases, tmp_path):
    scores = cases.adversarial_scores(10, "logits", seed=11)
    path = tmp_path / "in.npz"
    np.savez(path, scores=scores)
    return scores, path


def test_save_and_load_round_trip(saved_model, tmp_path):
    _, cord, path = saved_model
    model = load_model(path)
    assert model_metadata(model)["cord.eta_star"] == repr(cord.eta_)
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="broken.onnx"):
        load_model(broken)
    with pytest.raises(ValueError, match="missing.onnx"):
        load_model(tmp_path / "missing.onnx")


def test_sessions_pick_providers_and_threads(saved_model):
    _, _, path = saved_model
    session = open_session(path, provider="cpu", threads=2)
    assert session.get_providers() == ["CPUExecutionProvider"]
    auto = open_session(path, provider="auto")
    expected = "CUDAExecutionProvider" if "CUDAExecutionProvider" in \
        ort.get_available_providers() else "CPUExecutionProvider"
    # on a CUDA machine "auto" must actually run on CUDA, not quietly fall back to the CPU
    assert auto.get_providers()[0] == expected
    with pytest.raises(ValueError, match="provider"):
        open_session(path, provider="tpu")
    with pytest.raises(ValueError, match="threads"):
        open_session(path, threads=0)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(RuntimeError, match="gpu extra"):
            open_session(path, provider="cuda")


def test_batched_run_matches_one_run(saved_model, logits_file):
    _, _, path = saved_model
    scores, _ = logits_file
    session = open_session(path, provider="cpu")
    seen = []
    batched = run_batched(session, scores, batch_size=7, on_batch=seen.append)
    assert sum(seen) == len(scores) and max(seen) == 7
    whole = dict(zip([o.name for o in session.get_outputs()],
                     session.run(None, {"scores": scores}), strict=True))
    # Kernels may vectorise a batch of 7 rows differently: equal up to float32 rounding.
    for name, value in whole.items():
        np.testing.assert_allclose(batched[name], value, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(batched["label"], whole["label"])


def test_predict_file_writes_the_four_outputs(saved_model, logits_file, tmp_path, capsys, cases):
    cal, cord, path = saved_model
    scores, input_path = logits_file
    out = tmp_path / "sub" / "out.npz"
    summary = predict_file(path, input_path, out, batch_size=16, provider="cpu")
    assert summary["rows"] == len(scores) and summary["n_classes"] == 10
    # The progress went to stderr, which is no terminal here: whole lines, no redraws.
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("predict")]
    assert lines and "\r" not in err and err.endswith("\n")
    assert lines[-1].split()[2] == f"{len(scores)}/{len(scores)}"
    with np.load(out, allow_pickle=False) as written:
        assert sorted(written.files) == ["calibrated", "confidence", "label", "repaired"]
        outputs = {key: written[key] for key in written.files}
    expected = cases.reference(cal, cord, scores)
    diffs = cases.max_abs_diffs({**outputs, "original": expected["original"]}, expected)
    assert max(diffs.values()) <= 1e-5
    np.testing.assert_array_equal(outputs["label"], expected["label"])
    assert not [p for p in out.parent.iterdir() if p.name != "out.npz"]


@pytest.mark.parametrize("bad, message", [
    (lambda s: s[:, :9], "expected 10 classes"),
    (lambda s: np.where(np.arange(len(s))[:, None] == 7, np.nan, s), "row 7"),
    (lambda s: np.where(np.arange(len(s))[:, None] == 3, np.inf, s), "row 3"),
    (lambda s: s.astype(np.int64), "floating-point"),
    (lambda s: s[0], "2-D"),
    (lambda s: s[:0], "at least one row"),
])
def test_bad_input_is_rejected_before_running(bad, message, saved_model, logits_file,
                                              tmp_path, monkeypatch):
    _, _, path = saved_model
    scores, _ = logits_file
    bad_path = tmp_path / "bad.npz"
    np.savez(bad_path, scores=bad(scores))
    ran = []
    monkeypatch.setattr(predict_module, "run_batched", lambda *a, **k: ran.append(1))
    out = tmp_path / "out.npz"
    with pytest.raises((ValueError, TypeError), match=message):
        predict_file(path, bad_path, out, provider="cpu", progress=False)
    assert not ran and not out.exists()


def test_probability_models_check_the_simplex(cases, tmp_path):
    cal, cord = cases.fitted("irm", 10, "probs")
    path = save_model(export_onnx(cal, cord, 10, input_kind="probs"), tmp_path / "p.onnx")
    probs = cases.adversarial_scores(10, "probs", seed=2).astype(np.float64)
    probs[5] *= 1.5
    np.savez(tmp_path / "in.npz", probs=probs)
    with pytest.raises(ValueError, match="row 5"):
        predict_file(path, tmp_path / "in.npz", tmp_path / "out.npz", progress=False)
    np.savez(tmp_path / "pickled.npz", scores=np.array([object()] * 3))
    with pytest.raises(ValueError, match="pickle"):
        predict_file(path, tmp_path / "pickled.npz", tmp_path / "out.npz", progress=False)
    assert not (tmp_path / "out.npz").exists()


def test_no_partial_file_when_a_run_or_write_fails(saved_model, logits_file, tmp_path,
                                                   monkeypatch):
    _, _, path = saved_model
    _, input_path = logits_file
    out = tmp_path / "out.npz"
    out.write_bytes(b"previous result")

    def interrupted(self, rows):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(predict_module._StderrBar, "update", interrupted)
        with pytest.raises(KeyboardInterrupt):
            predict_file(path, input_path, out, batch_size=8, provider="cpu")

    def half_written(handle, **arrays):
        handle.write(b"PK partial")
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(predict_module.np, "savez", half_written)
        with pytest.raises(OSError, match="disk full"):
            predict_file(path, input_path, out, provider="cpu", progress=False)
    assert out.read_bytes() == b"previous result"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# ------------------------------------------------------------------ Parquet in and out
def test_parquet_in_and_out_keeps_other_columns_and_every_top1(saved_model, cases, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cord_ops import data

    _, _, path = saved_model
    scores = cases.adversarial_scores(10, "logits", seed=12)
    ids = [f"row-{i}" for i in range(len(scores))]
    for layout in ("list", "columns"):
        # The true labels are not carried beside the output's top-1 `label`.
        columns = {"id": ids, "labels": np.arange(len(scores)) % scores.shape[1],
                   **data.score_arrays(scores, "logits", layout)}
        source = tmp_path / f"in-{layout}.parquet"
        pq.write_table(pa.table(columns), source)
        out = tmp_path / f"out-{layout}.parquet"
        summary = predict_file(path, source, out, batch_size=7, progress=False)
        assert summary["rows"] == len(scores)
        table = pq.read_table(out)
        assert table.column_names == ["id", "label", "confidence", "repaired", "calibrated"]
        assert table.column("id").to_pylist() == ids
        repaired = np.stack(table.column("repaired").to_numpy(zero_copy_only=False))
        label = table.column("label").to_numpy()
        assert np.array_equal(label, np.argmax(scores.astype(np.float32), axis=1))
        assert np.array_equal(np.argmax(repaired, axis=1), label)
        # The same rows through .npz give the same numbers.
        npz_in = tmp_path / "in.npz"
        np.savez(npz_in, scores=scores)
        predict_file(path, npz_in, tmp_path / "out.npz", batch_size=7, progress=False)
        with np.load(tmp_path / "out.npz") as reference:
            assert np.array_equal(reference["repaired"], repaired)
            assert np.array_equal(reference["label"], label)


def test_bad_parquet_input_is_refused_before_anything_is_written(saved_model, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    _, _, path = saved_model
    rows = np.random.default_rng(0).normal(size=(20, 10))
    rows[13, 4] = np.nan
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"logits": list(rows)}), bad)
    out = tmp_path / "out.parquet"
    with pytest.raises(ValueError, match="bad.parquet: logits: row 13 contains NaN"):
        predict_file(path, bad, out, progress=False)
    narrow = tmp_path / "narrow.parquet"
    pq.write_table(pa.table({"logits": list(rows[:, :4])}), narrow)
    with pytest.raises(ValueError, match="narrow.parquet: logits has 4 classes; the model "
                                         "expects 10"):
        predict_file(path, narrow, out, progress=False)
    clash = tmp_path / "clash.parquet"
    pq.write_table(pa.table({"logits": list(np.nan_to_num(rows)), "label": range(20)}), clash)
    with pytest.raises(ValueError, match="column 'label' would be overwritten"):
        predict_file(path, clash, out, progress=False)
    assert not out.exists() and not list(tmp_path.glob("*.tmp"))
