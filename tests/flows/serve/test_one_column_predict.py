"""``cord-ops predict`` on a binary model's one score column a float32 rounding above 1:
scored as the row [0, 1] and reported like a renormalised row sum,
with an .onnx file (no store, no Prefect)."""

from __future__ import annotations

import numpy as np

from cord_ops import CORD
from cord_ops.calibrators import make_calibrator
from flows.cli.main import main
from onnx_export import export_onnx, save_model


def test_predict_clips_a_column_over_one_by_its_rounding_and_says_so(tmp_path, capsys):
    rng = np.random.default_rng(44)
    labels = rng.integers(0, 2, 400)
    p = 1 / (1 + np.exp(-3.0 * ((2 * labels - 1) + rng.normal(0, 1, 400))))
    rows = np.stack([1 - p, p], axis=1)
    cal = make_calibrator("vs", input_kind="probs").fit(rows, labels)
    cord = CORD().fit(rows, cal.predict_proba(rows))
    save_model(export_onnx(cal, cord, 2, input_kind="probs", dtype="float32"),
               tmp_path / "m.onnx")
    column = np.array([0.25, 1 + 10 * np.finfo(np.float32).eps, 0.75, 1.0], dtype=np.float32)
    np.savez(tmp_path / "in.npz", probs=column)
    assert main(["predict", "--model", str(tmp_path / "m.onnx"), "--input",
                 str(tmp_path / "in.npz"), "--output", str(tmp_path / "out.npz")]) == 0
    out = capsys.readouterr().out
    assert ("input: positive-class probabilities clipped to [0, 1], worst row 1 was "
            "1.19e-06 outside") in out
    with np.load(tmp_path / "out.npz") as scored:
        assert scored["label"].tolist() == [0, 1, 1, 1]
        # rows 1 and 3 are the same row [0, 1] once loaded: the same answer, bit for bit
        assert np.array_equal(scored["repaired"][1], scored["repaired"][3])
        assert np.isfinite(scored["repaired"]).all()
