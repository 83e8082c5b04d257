"""benchmarks/gpu_check.py, the prepared GPU check, in its tiny mode on this machine's
runtimes, and its parity bookkeeping (a top-1 change or a difference over the bound must
fail the check)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort

REPO = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks/gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _expected_runtime() -> str:
    if "CUDAExecutionProvider" in ort.get_available_providers() and \
            Path("/dev/nvidiactl").exists():
        return "onnxruntime-cuda"
    try:
        import torch
    except ImportError:
        return "cpu"
    return "torch-cuda" if torch.cuda.is_available() else "cpu"


def test_tiny_run_checks_parity_and_says_what_it_skipped(tmp_path, cases):
    data = tmp_path / "data"
    data.mkdir()
    logits, labels = cases.synthetic_split(100, 600, seed=11)
    np.savez(data / "cifar100_fake.npz", logits=logits.astype(np.float32), labels=labels)
    (data / "manifest.json").write_text(json.dumps({"cifar100_fake": {"n": 600, "K": 100}}))
    out = tmp_path / "gpu.json"
    status = _script().main(["--tiny", "--only", "vs", "--data", str(data), "--out", str(out)])
    report = json.loads(out.read_text())
    assert status == 0 and report["failures"] == 0
    runtime = report["environment"]["runtime"]
    assert runtime == _expected_runtime()
    checked = report["environment"]["runtimes_checked"]
    for stage, rows in (("cifar", 300), ("synthetic", 2000)):
        entries = report[stage]
        assert {(e["dtype"], e["runtime"]) for e in entries} == \
            {(d, r) for d in ("float32", "float64") for r in checked}
        assert all(e["ok"] and e["top1_changes"] == 0 and e["rows"] == rows
                   and e["nodes_off_device"] == [] for e in entries)
    assert any("GPU" in s["check"] for s in report["skipped"]) == (runtime == "cpu")
    (throughput,) = report["throughput"]
    assert throughput["K"] == 10 and throughput["cpu_onnxruntime_us"] > 0
    assert ("gpu_device_resident_us" in throughput) == (runtime != "cpu")


def test_cifar_stage_skips_with_the_reason_when_the_data_are_absent(tmp_path):
    script = _script()

    class Args:
        data, tiny = str(tmp_path / "nowhere"), True

    results, skipped = script.cifar_stage(Args, ["vs"], ["onnxruntime-cpu"], 1.0)
    assert results == []
    assert skipped[0]["check"] == "cifar" and "manifest.json" in skipped[0]["reason"]


def test_parity_fails_on_a_top1_change_or_a_difference_over_the_bound():
    parity_cls = _script().Parity
    rng = np.random.default_rng(0)
    repaired = rng.dirichlet(np.ones(5), 8)
    label = np.argmax(repaired, axis=1)
    want = {"repaired": repaired, "calibrated": repaired, "label": label,
            "confidence": repaired[np.arange(8), label]}

    def got(**changes):
        out = {key: value.copy() for key, value in want.items()}
        out["label"] = out["label"].reshape(-1, 1)
        out.update(changes)
        return out

    same = parity_cls("float32")
    same.add(got(), want)
    assert same.ok and same.top1_changes == 0 and same.rows == 8

    moved_label = got(label=((label + 1) % 5).reshape(-1, 1))
    moved = parity_cls("float32")
    moved.add(moved_label, want)
    assert not moved.ok and moved.top1_changes == 8

    swapped = repaired.copy()
    swapped[0, label[0]] = 0.0              # the label is no longer on top of row 0
    wrong_top = parity_cls("float64")
    wrong_top.add(got(repaired=swapped), want)
    assert not wrong_top.ok and wrong_top.top1_changes == 1

    off = parity_cls("float32")
    off.add(got(calibrated=repaired + 2e-5), want)
    assert not off.ok and off.top1_changes == 0 and off.max_abs["calibrated"] > 1e-5
