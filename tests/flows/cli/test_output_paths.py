"""``predict`` writes only where it was asked to: a batch input glob
whose ``..`` leads out of the folder it starts from is refused naming the file (its output
would land outside the output folder, or over an input), a ``..`` that stays inside maps
every file below the output folder, and an existing single-file ``--output`` is replaced
only with ``--overwrite``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cord_ops import CORD, data
from cord_ops.calibrators import make_calibrator
from flows.cli.main import main
from flows.files import expand_inputs
from onnx_export import export_onnx, save_model


def _parquet(path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"logits_0": [0.1, 2.0], "logits_1": [1.0, 0.5]}), path)


def test_a_glob_leading_out_of_its_folder_is_refused_naming_the_file(tmp_path, capsys):
    _parquet(tmp_path / "in" / "day=1" / "part-0.parquet")
    secret = tmp_path / "elsewhere" / "other.parquet"
    _parquet(secret)
    pattern = str(tmp_path / "in" / "*" / ".." / ".." / "elsewhere" / "*.parquet")
    with pytest.raises(ValueError, match=rf"^{secret}: matched by .* but outside "
                                         rf"{tmp_path / 'in'}, the folder the pattern starts"):
        expand_inputs(pattern)
    assert main(["predict", "--model", str(tmp_path / "m.onnx"), "--input", pattern,
                 "--output", str(tmp_path / "out")]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"error: {secret}: matched by") and "outside" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "in"]


def test_a_dot_dot_that_stays_inside_maps_every_file_below_the_output(tmp_path):
    inside = tmp_path / "in" / "day=1" / "part-0.parquet"
    _parquet(inside)
    # in/*/../day=1/*: the same file by a detour; its output must not follow the detour
    root, files = expand_inputs(str(tmp_path / "in" / "*" / ".." / "day=1" / "*.parquet"))
    assert root == tmp_path / "in"
    assert files == [inside]
    assert [f.relative_to(root).as_posix() for f in files] == ["day=1/part-0.parquet"]


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    rng = np.random.default_rng(0)
    logits = rng.normal(0.0, 2.0, (300, 3))
    labels = rng.integers(0, 3, 300)
    cal = make_calibrator("ts").fit(logits, labels)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    cord = CORD().fit(probs / probs.sum(axis=1, keepdims=True), cal.predict_proba(logits))
    return save_model(export_onnx(cal, cord, 3), tmp_path_factory.mktemp("m") / "m.onnx")


def test_an_existing_output_is_replaced_only_with_overwrite(tmp_path, small_model, capsys):
    batch = data.save_npz(tmp_path / "batch.npz", np.eye(3) * 2.0, np.arange(3), "logits")
    output = tmp_path / "out.npz"
    output.write_bytes(b"yesterday's scores")
    argv = ["predict", "--model", str(small_model), "--input", str(batch), "--output",
            str(output), "--provider", "cpu"]
    assert main(argv) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == (f"error: {output}: already exists; pass --overwrite to replace it, or "
                    "choose another --output")
    assert output.read_bytes() == b"yesterday's scores"
    assert main([*argv, "--overwrite"]) == 0
    with np.load(output, allow_pickle=False) as written:
        assert written["label"].tolist() == [0, 1, 2]
