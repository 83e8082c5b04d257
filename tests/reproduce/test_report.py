"""The report writers: every table and figure is produced, the numbers are the ones the
cells hold, the paper join works, and a failing write leaves the old report in place."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from flows.reproduce import report as reproduce_report
from flows.reproduce.cell import evaluate_cell

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CALIBRATORS = ("vs", "irova", "ts")


@pytest.fixture(scope="module")
def cells(paper_named_dir):
    return [evaluate_cell.fn(str(path), calibrator, seed, (0.0, 0.5, 1.0),
                                       (0.5, 1.0) if calibrator == "vs" else ())
            for path in sorted(paper_named_dir.glob("*.npz"))
            for calibrator in CALIBRATORS for seed in (0, 1)]


@pytest.fixture(scope="module")
def report(cells, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "out"
    failures = [{"file": "cifar10_resnet56", "calibrator": "ms", "seed": 0,
                 "error": "TimeoutError: too slow"}]
    written = reproduce_report.write_report(cells, failures, out, n_bootstrap=400)
    return out, written


def test_every_table_and_figure_is_written(report):
    out, written = report
    names = {p.name for p in written}
    for stem in ("table1_paired_reductions", "table2_minimal_repair", "table3_mean_target",
                 "table6_local_weight", "table7_cifar10", "agreement", "size_sensitivity",
                 "timings", "failures"):
        assert {f"{stem}.md", f"{stem}.csv"} <= names, stem
    for png in ("figure2_tradeoff.png", "figure4_size.png", "reliability_cifar10.png"):
        assert (out / png).read_bytes()[:8] == PNG_MAGIC
    assert all(p.parent == out and p.exists() for p in written)
    assert (out / "table2_minimal_repair.md").read_text().startswith("# Table 2")
    assert "TimeoutError" in (out / "failures.md").read_text()
    assert not list(out.parent.glob(".out.*"))  # no staging folder left behind


def test_table1_is_the_mean_paired_reduction_over_non_preserving_conditions(cells, report):
    out, _ = report
    table = pd.read_csv(out / "table1_paired_reductions.csv")
    ece = table[table["quantity"] == "dR ECE (pp)"].iloc[0]
    per_condition = {}
    for cell in cells:
        if cell["calibrator"] == "ts":  # fit-time baseline: not a CORD condition
            continue
        key = (cell["classifier"], cell["calibrator"])
        reduction = cell["reports"]["base"]["ece"] - cell["reports"]["cord"]["ece"]
        per_condition.setdefault(key, []).append(100 * reduction)
    expected = np.mean([np.mean(v) for v in per_condition.values()])
    assert ece["conditions"] == 6
    assert ece["mean"] == pytest.approx(expected, abs=1e-12)
    assert ece["ci_low"] <= ece["mean"] <= ece["ci_high"]
    assert ece["ci_level"] == pytest.approx(1 - 0.05 / 3)  # one dataset x three metrics


def test_table7_joins_the_papers_cells_and_agreement_uses_them(report):
    out, _ = report
    table = pd.read_csv(out / "table7_cifar10.csv")
    row = table[(table["classifier"] == "resnet56") & (table["calibrator"] == "vs")].iloc[0]
    assert row["paper_tpcr"] == 0.48 and row["paper_uncal_acc"] == 94.38
    assert np.isnan(table[table["classifier"] == "tinynet"]["paper_tpcr"]).all()
    assert (table["cord_tpcr"] == 0.0).all()
    agreement = pd.read_csv(out / "agreement.csv")
    tpcr = agreement[agreement["quantity"] == "Base TPCR (%)"].iloc[0]
    matched = table.dropna(subset=["paper_tpcr"])
    assert tpcr["n"] == len(matched) == 4  # resnet56 and vgg16_bn x vs, irova
    assert tpcr["mean_abs_diff"] == pytest.approx(
        np.mean(np.abs(matched["tpcr"] - matched["paper_tpcr"])))


def _condition_values(cells, report_name, metric) -> dict:
    """Split-averaged ``metric`` of ``report_name`` per (classifier, calibrator) condition
    of the prediction-changing calibrators."""
    per_condition = {}
    for cell in cells:
        if cell["calibrator"] == "ts":
            continue
        key = (cell["classifier"], cell["calibrator"])
        per_condition.setdefault(key, []).append(cell["reports"][report_name][metric])
    return {key: float(np.mean(values)) for key, values in per_condition.items()}


def test_tables_2_3_6_cover_their_reports(cells, report):
    out, _ = report
    t2 = pd.read_csv(out / "table2_minimal_repair.csv")
    assert list(t2["report"]) == ["minimal", "cord"]
    t3 = pd.read_csv(out / "table3_mean_target.csv")
    assert list(t3["report"]) == ["mean_none", "mean_local", "mean_pointwise", "cord"]
    # each entry is the mean over conditions of the split-averaged cell values
    none = _condition_values(cells, "mean_none", "mean_gap_pp")
    cord = _condition_values(cells, "cord", "mean_gap_pp")
    row = t3.set_index("report").loc["mean_none"]
    assert row["mean_gap_pp"] == pytest.approx(np.mean(list(none.values())), abs=1e-9)
    # the Holm-adjusted p-value lies between the raw one-sided Wilcoxon p of that
    # comparison and m times it (m = 12 tests: 3 variants x 4 columns)
    keys = sorted(none)
    raw = stats.wilcoxon([none[k] - cord[k] for k in keys], alternative="greater").pvalue
    assert raw - 1e-12 <= row["p_mean_gap_pp"] <= min(1.0, 12 * raw) + 1e-12
    assert np.isnan(t3["p_ece"].iloc[3])  # CORD is not tested against itself
    t6 = pd.read_csv(out / "table6_local_weight.csv")
    assert sorted(t6[t6["dataset"] == "all"]["lambda"]) == [0.0, 0.5, 1.0]
    size = pd.read_csv(out / "size_sensitivity.csv")
    assert set(size["fraction"]) == {0.5, 1.0}
    assert (size[size["report"] == "cord"]["tpcr"] == 0.0).all()


def test_a_failing_write_keeps_the_previous_report(cells, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.csv").write_text("previous")

    def broken_figure(*args):
        raise RuntimeError("disk full")

    # the last file of the report fails, after every table has been staged
    monkeypatch.setattr(reproduce_report, "size_figure", broken_figure)
    with pytest.raises(RuntimeError, match="disk full"):
        reproduce_report.write_report(cells, [], out, n_bootstrap=10)
    assert [p.name for p in out.iterdir()] == ["results.csv"]
    assert (out / "results.csv").read_text() == "previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_markdown_renders_floats_blanks_and_tuples():
    frame = pd.DataFrame({"a": [1.23456, np.nan], "b": [(1.0, 2.0), None], "c": ["x", "y"]})
    assert reproduce_report.markdown(frame, digits=2) == (
        "| a | b | c |\n|---|---|---|\n| 1.23 | 1.00 / 2.00 | x |\n|  |  | y |\n")
