"""One (file, calibrator, seed) task: the split protocol, one fit reused by every repair, and
the sweep plan."""

from __future__ import annotations

import argparse
import io

import numpy as np
import pytest

from cord_ops import CORD, data, metrics
from cord_ops.calibrators import make_calibrator
from flows.platform.progress import Progress
from flows.reproduce import cli as reproduce_cli
from flows.reproduce import flow as reproduce_flow
from flows.reproduce import plan as reproduce_plan
from flows.reproduce.cell import evaluate_cell
from flows.reproduce.defaults import (
    LOCAL_WEIGHTS,
    MEAN_TARGET_VARIANTS,
    QUICK_CALIBRATORS,
    dataset_and_classifier,
)


@pytest.fixture(scope="module")
def cell(synthetic_dir):
    return evaluate_cell.fn(str(synthetic_dir / "toya_net1.npz"), "vs", 3,
                                      LOCAL_WEIGHTS, (0.5, 1.0))


def test_base_report_follows_the_papers_split_protocol(cell, synthetic_dir):
    dataset = data.load_npz(synthetic_dir / "toya_net1.npz")
    perm = np.random.default_rng(3).permutation(dataset.n)
    cal, held = perm[: dataset.n // 2], perm[dataset.n // 2:]
    model = make_calibrator("vs").fit(dataset.scores[cal], dataset.labels[cal])
    q = model.predict_proba(dataset.scores[held])
    p0 = dataset.probabilities()[held]
    expected = metrics.evaluate(q, dataset.labels[held], reference=p0)
    for name, value in expected.items():
        assert cell["reports"]["base"][name] == pytest.approx(value, abs=1e-9), name
    assert cell["n_calibration"] == cell["n_evaluation"] == 150
    assert cell["reports"]["base"]["tpcr"] > 0  # VS flips decisions on this data


def test_every_repair_keeps_every_decision(cell):
    uncal_acc = cell["reports"]["uncal"]["accuracy"]
    repairs = ["cord", "minimal", *(f"mean_{t}" for t in MEAN_TARGET_VARIANTS),
               *(f"lambda_{w:g}" for w in LOCAL_WEIGHTS)]
    for name in repairs:
        assert cell["reports"][name]["tpcr"] == 0.0, name
        assert cell["reports"][name]["accuracy"] == uncal_acc, name
    assert np.isfinite(cell["reports"]["cord"]["eta_star"])


def test_local_weight_and_mean_target_reports_match_independent_fits(cell, synthetic_dir):
    """Each variant's report is the one an independent CORD fit with that setting gives
    (computed here from the split, not copied from the cell), and the settings matter."""
    dataset = data.load_npz(synthetic_dir / "toya_net1.npz")
    perm = np.random.default_rng(3).permutation(dataset.n)
    cal, held = perm[: dataset.n // 2], perm[dataset.n // 2:]
    model = make_calibrator("vs").fit(dataset.scores[cal], dataset.labels[cal])
    q_cal, q_eval = model.predict_proba(dataset.scores[cal]), model.predict_proba(
        dataset.scores[held])
    p0 = dataset.probabilities()
    y = dataset.labels[held]
    for weight in (0.0, 0.5, 1.0):
        fitted = CORD(local_weight=weight).fit(p0[cal], q_cal)
        expected = metrics.evaluate(fitted.transform(p0[held], q_eval), y, reference=p0[held])
        report = cell["reports"][f"lambda_{weight:g}"]
        assert report["eta_star"] == pytest.approx(fitted.eta_, abs=1e-12)
        for name, value in expected.items():
            assert report[name] == pytest.approx(value, abs=1e-12), (weight, name)
    assert cell["reports"]["lambda_0"]["eta_star"] != cell["reports"]["lambda_1"]["eta_star"]

    repaired = CORD(mean_target="none").fit(p0[cal], q_cal).transform(p0[held], q_eval)
    rows, a = np.arange(held.size), np.argmax(p0[held], axis=1)
    gap = 100.0 * abs(repaired[rows, a].mean() - q_eval[rows, a].mean())
    assert cell["reports"]["mean_none"]["mean_gap_pp"] == pytest.approx(gap, abs=1e-9)
    assert gap > cell["reports"]["cord"]["mean_gap_pp"]  # CORD's target closes the gap


def test_size_study_reuses_the_full_fit_and_refits_subsets(cell):
    points = {(p["fraction"], p["report"]): p for p in cell["size_points"]}
    assert set(points) == {(0.5, "base"), (0.5, "cord"), (1.0, "base"), (1.0, "cord")}
    assert points[(1.0, "base")]["ece"] == cell["reports"]["base"]["ece"]
    assert points[(1.0, "cord")]["nll"] == cell["reports"]["cord"]["nll"]
    assert points[(0.5, "base")]["n_calibration"] == 75
    assert points[(0.5, "cord")]["tpcr"] == 0.0
    assert points[(0.5, "base")]["ece"] != points[(1.0, "base")]["ece"]


def test_quick_plan_takes_one_seed_one_file_per_dataset_and_three_calibrators(synthetic_dir):
    plan = reproduce_plan.plan_sweep(synthetic_dir, quick=True)
    assert plan.seeds == (0,)
    assert sorted(dataset_and_classifier(f)[0] for f in plan.files) == \
        ["toya", "toyb"]
    assert plan.calibrators == QUICK_CALIBRATORS
    assert len(plan.cells()) == 6


def test_full_plan_submits_the_slowest_fits_first(synthetic_dir):
    plan = reproduce_plan.plan_sweep(synthetic_dir, seeds=2)
    cells = plan.cells()
    assert len(cells) == 3 * 11 * 2
    assert [c[1] for c in cells[:6]] == ["dir-odir"] * 6
    assert cells[-1][1] == "ts"
    assert plan.size_calibrators == ("vs", "svs", "irova", "irova-ts")


def test_plan_rejects_bad_input_before_anything_runs(synthetic_dir, tmp_path):
    with pytest.raises(ValueError, match="unknown"):
        reproduce_plan.plan_sweep(synthetic_dir, calibrators=["vs", "platt"])
    with pytest.raises(ValueError, match="--seeds"):
        reproduce_plan.plan_sweep(synthetic_dir, seeds=0)
    with pytest.raises(FileNotFoundError, match="no .npz"):
        reproduce_plan.plan_sweep(tmp_path)
    (tmp_path / "bad_file.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="bad_file.npz"):
        reproduce_plan.plan_sweep(tmp_path)


def test_add_cli_wires_reproduce_and_bench(synthetic_dir):
    parser = argparse.ArgumentParser()
    reproduce_cli.add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["reproduce", "--data", str(synthetic_dir), "--quick",
                              "--dask-address", "tcp://127.0.0.1:8786", "--calibrators",
                              "vs", "ts"])
    assert args.func is reproduce_cli.run_reproduce
    assert (args.quick, args.dask_address, args.calibrators, args.seeds) == \
        (True, "tcp://127.0.0.1:8786", ["vs", "ts"], 5)
    assert parser.parse_args(["bench"]).func.__name__ == "run_bench"
    with pytest.raises(SystemExit):
        parser.parse_args(["reproduce", "--calibrators", "platt"])


def test_a_failed_task_is_recorded_and_the_others_are_kept(prefect_harness):
    from prefect import flow, task

    @task
    def cell(calibrator: str) -> dict:
        if calibrator == "ms":
            raise RuntimeError("diverged")
        return {"calibrator": calibrator}

    out = io.StringIO()

    @flow
    def sweep():
        futures = {("/data/toya_net1.npz", name, 0): cell.submit(name)
                   for name in ("vs", "ms", "ts")}
        return reproduce_flow._collect(futures, Progress(3, "reproduce", stream=out, every=0))

    results, failures = sweep()
    assert results == [{"calibrator": "vs"}, {"calibrator": "ts"}]  # submission order
    assert failures == [{"file": "toya_net1", "calibrator": "ms", "seed": 0,
                         "error": "RuntimeError: diverged"}]
    lines = out.getvalue().splitlines()
    assert [line.split(" cells")[0] for line in lines] == \
        ["reproduce: 1/3", "reproduce: 2/3", "reproduce: 3/3"]
    assert sum(line.endswith("toya_net1/ms/seed0 FAILED") for line in lines) == 1


def test_quick_falls_back_to_two_bundled_digits_classifiers(tmp_path):
    folder = reproduce_plan.write_digits_data(tmp_path / "digits")
    plan = reproduce_plan.plan_sweep(folder, quick=True)
    assert [dataset_and_classifier(f) for f in plan.files] == \
        [("digits", "a"), ("digits", "b")]
    first, second = (data.load_npz(f) for f in plan.files)
    assert first.n_classes == second.n_classes == 10
    assert not np.array_equal(first.labels, second.labels)  # different held-out rows
