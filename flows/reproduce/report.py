"""Tables (Markdown + CSV) and figures (PNG, headless matplotlib) of a reproduction sweep.

Input: the per-(file, calibrator, seed) results of
:func:`flows.reproduce.cell.evaluate_cell`. Output files (``write_report``):

- ``results.csv``: every report of every cell, one row each (the raw numbers);
- ``table1_paired_reductions``: mean Base - Base+CORD reductions with Bonferroni-adjusted
  simultaneous 95% paired-bootstrap CIs (paper Table 1);
- ``table2_minimal_repair``: CORD vs minimal repair, Holm-adjusted paired tests (Table 2);
- ``table3_mean_target``: mean-target ablation with Holm-adjusted tests (Tables 3, 10);
- ``table6_local_weight``: local-weight sensitivity (Appendix B, Table 6);
- ``table7_<dataset>``: per classifier x calibrator, the paper's values beside ours where
  the paper has the same classifier (Tables 7, 8);
- ``agreement``: per quantity, Pearson r and mean |diff| of our cells vs the paper's;
- ``size_sensitivity``: Base and Base+CORD over calibration fractions (Figure 4 data);
- ``timings``: where the compute went, per dataset and calibrator;
- ``table4_<dataset>``, ``table11_<dataset>``, ``table12_<dataset>``: fit-time vs post-fit
  prediction preservation (Table 4 and its extensions; :mod:`flows.reproduce.preserving`);
- ``figure1_changes``: top-1 changes of Base split into C+ / C- / C0 (Figure 1);
- ``figure2_tradeoff.png``, ``figure4_size.png``, ``reliability_<dataset>.png``.

Conventions follow the paper: statistics are taken over conditions (classifier x
calibrator of one dataset) after averaging their splits, and only the seven
prediction-changing calibrators form conditions for Tables 1-3 and 6. ECE, TPCR and
accuracy are shown in %, Brier reductions of Tables 1 and 6 in units of 1e-3.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from flows.reproduce import paper
from flows.reproduce import preserving as pp
from flows.reproduce import stats as rs
from flows.reproduce.defaults import (
    CALIBRATORS,
    LOCAL_WEIGHTS,
    MEAN_TARGET_VARIANTS,
    NON_PRESERVING,
)

PERCENT = ("ece", "ece_em", "smece", "accuracy", "tpcr")
N_BOOTSTRAP = rs.N_RESAMPLES
CONFIDENCE = 0.95
_KEYS = ["dataset", "classifier", "calibrator"]


# ------------------------------------------------------------------------- data frames


def results_frame(cells: list[dict]) -> pd.DataFrame:
    """One row per (file, calibrator, seed, report) with every metric of that report."""
    rows = []
    for cell in cells:
        head = {k: cell[k] for k in ("file", "dataset", "classifier", "calibrator", "seed")}
        for report, values in cell["reports"].items():
            rows.append({**head, "report": report, **values})
    return pd.DataFrame(rows)


def condition_means(results: pd.DataFrame) -> pd.DataFrame:
    """Split-averaged metrics per (dataset, classifier, calibrator, report)."""
    numeric = [c for c in results.columns if c not in
               ("file", "dataset", "classifier", "calibrator", "seed", "report")]
    return results.groupby([*_KEYS, "report"], sort=True)[numeric].mean().reset_index()


def _report(conditions: pd.DataFrame, report: str, calibrators) -> pd.DataFrame:
    rows = conditions[(conditions["report"] == report)
                      & conditions["calibrator"].isin(calibrators)]
    return rows.set_index(_KEYS).sort_index()


def _paired(conditions: pd.DataFrame, dataset: str | None, first: str, second: str,
            metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Aligned condition-level values of ``metric`` for two reports (optionally one dataset)."""
    a = _report(conditions, first, NON_PRESERVING)[metric]
    b = _report(conditions, second, NON_PRESERVING)[metric]
    joined = pd.concat([a.rename("a"), b.rename("b")], axis=1, join="inner").dropna()
    if dataset is not None:
        joined = joined[joined.index.get_level_values("dataset") == dataset]
    return joined["a"].to_numpy(), joined["b"].to_numpy()


def _datasets_with_conditions(conditions: pd.DataFrame) -> list[str]:
    base = _report(conditions, "base", NON_PRESERVING)
    return sorted(set(base.index.get_level_values("dataset")))


# ------------------------------------------------------------------------------ tables


_SCALE = {"ece": 100.0, "nll": 1.0, "brier": 1000.0}
_UNIT = {"ece": "dR ECE (pp)", "nll": "dR NLL", "brier": "dR Brier (x1e-3)"}


def table1(conditions: pd.DataFrame, n_bootstrap: int = N_BOOTSTRAP) -> pd.DataFrame:
    """Mean paired reductions M(Base) - M(Base+CORD) per dataset with simultaneous CIs:
    Bonferroni over every (dataset, metric) interval of the table."""
    datasets = _datasets_with_conditions(conditions)
    n_intervals = max(1, 3 * len(datasets))
    rows = []
    for i, dataset in enumerate(datasets):
        for j, metric in enumerate(("ece", "nll", "brier")):
            base, cord = _paired(conditions, dataset, "base", "cord", metric)
            scale = _SCALE[metric]
            ci = rs.paired_bootstrap_ci(base * scale, cord * scale, confidence=CONFIDENCE,
                                        n_intervals=n_intervals, n_resamples=n_bootstrap,
                                        seed=10 * i + j)
            published = paper.TABLE1.get(dataset, (np.nan,) * 3)[j]
            rows.append({"dataset": dataset, "quantity": _UNIT[metric],
                         "conditions": base.size, "mean": ci.mean, "ci_low": ci.low,
                         "ci_high": ci.high, "ci_level": ci.level, "paper": published})
    return pd.DataFrame(rows)


def table2(conditions: pd.DataFrame) -> pd.DataFrame:
    """Mean ECE (%), NLL, Brier of minimal repair and CORD; stars on minimal repair mark a
    significant reduction by CORD (one-sided Wilcoxon, Holm over the whole table)."""
    return _comparison(conditions, ("minimal",), ("ece", "nll", "brier"),
                       lambda d, r: paper.TABLE2.get(d, {}).get(r))


def table3(conditions: pd.DataFrame) -> pd.DataFrame:
    """Mean-target ablation: ECE (%), NLL, Brier and |mean s - mean b| (pp) per variant;
    stars mark a significant reduction by CORD relative to that variant (Holm)."""
    variants = tuple(f"mean_{t}" for t in MEAN_TARGET_VARIANTS)
    return _comparison(conditions, variants, ("ece", "nll", "brier", "mean_gap_pp"),
                       lambda d, r: paper.TABLE3.get(d, {}).get(r))


def _comparison(conditions: pd.DataFrame, others: tuple[str, ...], columns: tuple[str, ...],
                published) -> pd.DataFrame:
    """Mean of each column per dataset and report; ``p_<column>`` is the Holm-adjusted
    p-value (over every test of the table) that CORD is lower than that report."""
    rows, tests = [], []
    for dataset in _datasets_with_conditions(conditions):
        for report in (*others, "cord"):
            row = {"dataset": dataset, "report": report}
            for column in columns:
                mine, cord = _paired(conditions, dataset, report, "cord", column)
                scale = 100.0 if column in PERCENT else 1.0
                row[column] = float(mine.mean() * scale) if mine.size else np.nan
                row[f"p_{column}"] = np.nan
                if report != "cord" and mine.size:
                    tests.append((len(rows), column, rs.paired_test(mine, cord)))
            row["conditions"] = int(mine.size)
            row["paper"] = published(dataset, report)
            rows.append(row)
    if tests:
        adjusted = rs.holm_adjust([p for _, _, p in tests])
        for (i, column, _), p in zip(tests, adjusted, strict=True):
            rows[i][f"p_{column}"] = float(p)
    return pd.DataFrame(rows)


def table6(conditions: pd.DataFrame) -> pd.DataFrame:
    """Mean paired reductions of each local weight over all conditions (the paper pools its
    114 conditions across datasets) and per dataset."""
    weights = [w for w in LOCAL_WEIGHTS
               if f"lambda_{w:g}" in set(conditions["report"])]
    rows = []
    for dataset in [None, *_datasets_with_conditions(conditions)]:
        for weight in weights:
            row = {"dataset": dataset or "all", "lambda": weight}
            for metric in ("ece", "nll", "brier"):
                base, repaired = _paired(conditions, dataset, "base", f"lambda_{weight:g}",
                                         metric)
                row[_UNIT[metric]] = float((base - repaired).mean() * _SCALE[metric]) \
                    if base.size else np.nan
                row["conditions"] = int(base.size)
            row["paper"] = paper.TABLE6.get(weight) if dataset is None else None
            rows.append(row)
    return pd.DataFrame(rows)


def table7(conditions: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """Per classifier x calibrator of one dataset: Uncal. accuracy, dAcc (pp), Base TPCR (%),
    Base M / dR M for ECE (%), NLL, Brier, mean eta*, TPCR after CORD; ``paper_*`` columns
    hold Tables 7/8 where the paper has the same cell."""
    mine = conditions[conditions["dataset"] == dataset]
    published = paper.table7_cells()
    rows = []
    for (classifier, calibrator), group in mine.groupby(["classifier", "calibrator"]):
        by = group.set_index("report")
        uncal, base, cord = by.loc["uncal"], by.loc["base"], by.loc["cord"]
        row = {"classifier": classifier, "calibrator": calibrator,
               "uncal_acc": 100 * uncal["accuracy"],
               "d_acc": 100 * (base["accuracy"] - uncal["accuracy"]),
               "tpcr": 100 * base["tpcr"],
               "ece": 100 * base["ece"], "d_ece": 100 * (base["ece"] - cord["ece"]),
               "nll": base["nll"], "d_nll": base["nll"] - cord["nll"],
               "brier": base["brier"], "d_brier": base["brier"] - cord["brier"],
               "eta_star": cord["eta_star"], "cord_tpcr": 100 * cord["tpcr"]}
        theirs = published.get((dataset, classifier, calibrator))
        for key in ("uncal_acc", "d_acc", "tpcr", "ece", "d_ece", "nll", "d_nll", "brier",
                    "d_brier"):
            row[f"paper_{key}"] = theirs[key] if theirs else np.nan
        rows.append(row)
    order = {name: i for i, name in enumerate(CALIBRATORS)}
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    frame["_order"] = frame["calibrator"].map(order)
    return frame.sort_values(["classifier", "_order"]).drop(columns="_order")


_AGREEMENT = (("Base TPCR (%)", "tpcr"), ("dAcc (pp)", "d_acc"), ("Base ECE (%)", "ece"),
              ("dR ECE (pp)", "d_ece"), ("Base NLL", "nll"), ("dR NLL", "d_nll"),
              ("Base Brier", "brier"), ("dR Brier", "d_brier"))


def agreement_table(tables7: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Pearson r and mean |ours - paper| over the cells both have, per dataset and quantity."""
    rows = []
    for dataset, frame in tables7.items():
        if frame.empty:
            continue
        matched = frame.dropna(subset=["paper_tpcr"])
        if len(matched) < 2:
            continue
        for label, key in _AGREEMENT:
            stats = rs.agreement(matched[key].to_numpy(), matched[f"paper_{key}"].to_numpy())
            rows.append({"dataset": dataset, "quantity": label, **stats})
    return pd.DataFrame(rows)


def size_frame(cells: list[dict]) -> pd.DataFrame:
    """One row per (cell, calibration fraction, report) of the size study."""
    rows = []
    for cell in cells:
        head = {k: cell[k] for k in ("file", "dataset", "classifier", "calibrator", "seed")}
        rows.extend({**head, **point} for point in cell["size_points"])
    return pd.DataFrame(rows)


def size_table(sizes: pd.DataFrame) -> pd.DataFrame:
    """Per dataset, fraction and report: the mean over classifiers and calibrators of each
    split, then the mean over splits with a pointwise 95% t-interval (Figure 4's bands)."""
    if sizes.empty:
        return sizes
    per_seed = sizes.groupby(["dataset", "fraction", "report", "seed"])[
        ["tpcr", "ece", "nll", "brier"]].mean().reset_index()
    rows = []
    for (dataset, fraction, report), group in per_seed.groupby(
            ["dataset", "fraction", "report"]):
        row = {"dataset": dataset, "fraction": fraction, "report": report,
               "splits": len(group)}
        for metric in ("tpcr", "ece", "nll", "brier"):
            scale = 100.0 if metric in PERCENT else 1.0
            mean, low, high = rs.mean_interval(group[metric].to_numpy() * scale)
            row.update({metric: mean, f"{metric}_low": low, f"{metric}_high": high})
        rows.append(row)
    return pd.DataFrame(rows)


def timings_table(cells: list[dict]) -> pd.DataFrame:
    """Total seconds per dataset and calibrator in each stage (summed over files and seeds)."""
    rows = [{"dataset": c["dataset"], "calibrator": c["calibrator"], **c["timings"]}
            for c in cells]
    if not rows:
        return pd.DataFrame()
    frame = pd.DataFrame(rows).groupby(["dataset", "calibrator"]).sum(min_count=1)
    frame["total"] = frame.sum(axis=1)
    return frame.reset_index().sort_values("total", ascending=False)


def workers_table(cells: list[dict]) -> pd.DataFrame:
    """Tasks and busy seconds per Dask worker (host:pid), the busiest first."""
    frame = pd.DataFrame([{"worker": c["worker"], "tasks": 1,
                           "busy_seconds": sum(c["timings"].values())} for c in cells])
    if frame.empty:
        return frame
    return frame.groupby("worker").sum().reset_index().sort_values("busy_seconds",
                                                                   ascending=False)


# ----------------------------------------------------------------------------- figures


def _figure(rows: int, cols: int, width: float, height: float):
    """A figure drawn on its own Agg canvas, without pyplot: matplotlib's process-wide
    backend is never touched, and it is safe in any thread."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * cols, height * rows), dpi=90)
    FigureCanvasAgg(fig)
    axes = np.atleast_2d(fig.subplots(rows, cols, squeeze=False))
    return fig, axes


_MARKERS = dict(zip(CALIBRATORS, "osD^vPX*<hd", strict=True))


def tradeoff_figure(conditions: pd.DataFrame, path: Path) -> Path:
    """Figure 2: ECE (%), NLL and Brier against TPCR (%), one row per dataset (their scales
    differ); per calibrator (marker) the classifier- and split-averaged Base point, joined by
    a dashed line to its Base+CORD point at TPCR 0; the grey band marks TPCR = 0."""
    base = _report(conditions, "base", NON_PRESERVING).reset_index()
    cord = _report(conditions, "cord", NON_PRESERVING).reset_index()
    columns = ["tpcr", "ece", "nll", "brier"]
    base_mean = base.groupby(["dataset", "calibrator"])[columns].mean()
    cord_mean = cord.groupby(["dataset", "calibrator"])[columns].mean()
    datasets = sorted(set(base["dataset"]))
    fig, axes = _figure(len(datasets), 3, 4.2, 3.3)
    for r, dataset in enumerate(datasets):
        for ax, metric in zip(axes[r], ("ece", "nll", "brier"), strict=True):
            scale = 100.0 if metric == "ece" else 1.0
            ax.axvline(0.0, color="0.85", linewidth=6, zorder=0)
            for i, ((_, calibrator), row) in enumerate(base_mean.loc[[dataset]].iterrows()):
                after = cord_mean.loc[(dataset, calibrator)]
                x = [100 * row["tpcr"], 100 * after["tpcr"]]
                y = [scale * row[metric], scale * after[metric]]
                colour = f"C{i}"
                ax.plot(x, y, linestyle="--", color=colour, linewidth=0.8)
                ax.scatter(x[:1], y[:1], marker=_MARKERS.get(calibrator, "o"), color=colour,
                           label=calibrator)
                ax.scatter(x[1:], y[1:], marker=_MARKERS.get(calibrator, "o"),
                           facecolors="none", edgecolors=colour)
            ax.set_xlabel("TPCR (%)")
            ax.set_ylabel({"ece": "ECE (%)", "nll": "NLL", "brier": "Brier"}[metric])
            ax.set_title(dataset, fontsize=9)
        axes[r][0].legend(fontsize=7)
    fig.suptitle("Base (filled) -> Base + CORD (hollow), averaged over classifiers and splits",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    return path


def _mean_curve(cells: list[dict], report: str) -> tuple[np.ndarray, np.ndarray]:
    confidence = np.array([c["reliability"][report]["confidence"] for c in cells], float)
    accuracy = np.array([c["reliability"][report]["accuracy"] for c in cells], float)
    with warnings.catch_warnings():
        # a bin empty in every split stays NaN and is skipped by the plot
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(confidence, axis=0), np.nanmean(accuracy, axis=0)


def reliability_figure(cells: list[dict], dataset: str, path: Path) -> Path:
    """Figures 5/6: rows are classifiers, columns Uncal. and each calibrator; per-bin accuracy
    against mean confidence averaged over splits, Base and Base + CORD; titles give ECE (%)
    as Uncal. or Base -> Base + CORD."""
    mine = [c for c in cells if c["dataset"] == dataset]
    classifiers = sorted({c["classifier"] for c in mine})
    order = CALIBRATORS
    calibrators = sorted({c["calibrator"] for c in mine}, key=lambda n: (n not in order,
                         order.index(n) if n in order else 0, n))
    fig, axes = _figure(len(classifiers), 1 + len(calibrators), 2.1, 2.1)
    for r, classifier in enumerate(classifiers):
        for col, calibrator in enumerate([None, *calibrators]):
            ax = axes[r][col]
            ax.plot([0, 1], [0, 1], color="0.6", linewidth=0.7, linestyle=":")
            group = [c for c in mine if c["classifier"] == classifier
                     and (calibrator is None or c["calibrator"] == calibrator)]
            if not group:
                ax.set_axis_off()
                continue
            reports = ("uncal",) if calibrator is None else ("base", "cord")
            for report, style in zip(reports, ("-o", "--s"), strict=False):
                x, y = _mean_curve(group, report)
                keep = np.isfinite(x) & np.isfinite(y)
                ax.plot(x[keep], y[keep], style, markersize=2.5, linewidth=1, label=report)
            eces = [100 * np.mean([c["reports"][rep]["ece"] for c in group]) for rep in reports]
            name = "Uncal." if calibrator is None else calibrator
            ax.set_title(f"{name} ({' -> '.join(f'{e:.2f}' for e in eces)})", fontsize=7)
            ax.set_xlim(0, 1)
            ax.set_ylim(0, 1)
            ax.tick_params(labelsize=6)
            if col == 0:
                ax.set_ylabel(classifier, fontsize=7)
    axes[0][-1].legend(fontsize=6, loc="upper left")
    fig.suptitle(f"Reliability diagrams, {dataset} (accuracy vs confidence)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    return path


def size_figure(summary: pd.DataFrame, path: Path) -> Path:
    """Figure 4 / 9: TPCR, ECE, NLL, Brier of Base and Base + CORD against the calibration
    fraction, averaged over classifiers and calibrators, with pointwise 95% bands over
    splits."""
    datasets = sorted(set(summary["dataset"]))
    metrics_shown = ("tpcr", "ece", "nll", "brier")
    fig, axes = _figure(len(datasets), len(metrics_shown), 3.0, 2.6)
    for r, dataset in enumerate(datasets):
        for col, metric in enumerate(metrics_shown):
            ax = axes[r][col]
            for report, colour in (("base", "C0"), ("cord", "C3")):
                rows = summary[(summary["dataset"] == dataset) & (summary["report"] == report)]
                rows = rows.sort_values("fraction")
                x = 100 * rows["fraction"].to_numpy()
                ax.plot(x, rows[metric], "-o", color=colour, markersize=3,
                        label="Base" if report == "base" else "Base + CORD")
                ax.fill_between(x, rows[f"{metric}_low"], rows[f"{metric}_high"],
                                color=colour, alpha=0.2, linewidth=0)
            unit = " (%)" if metric in PERCENT else ""
            ax.set_title(f"{dataset}: {metric.upper()}{unit}", fontsize=8)
            ax.set_xlabel("calibration fraction (%)", fontsize=7)
            ax.tick_params(labelsize=6)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path)
    return path


# ----------------------------------------------------------------------------- writing


def markdown(frame: pd.DataFrame, digits: int = 4) -> str:
    """A GitHub Markdown table of ``frame`` (floats to ``digits`` decimals, NaN blank)."""
    def cell(value) -> str:
        if isinstance(value, float | np.floating):
            return "" if np.isnan(value) else f"{value:.{digits}f}"
        if isinstance(value, tuple):
            return " / ".join(cell(v) for v in value)
        return "" if value is None else str(value)

    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "---|" * len(frame.columns)
    body = ["| " + " | ".join(cell(v) for v in row) + " |"
            for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body]) + "\n"


def _write_table(frame: pd.DataFrame, stage: Path, name: str, title: str,
                 note: str = "", shown: pd.DataFrame | None = None) -> list[Path]:
    """``name``.csv holds ``frame``; ``name``.md the title, note and ``shown`` (default
    ``frame``) as a Markdown table."""
    csv = stage / f"{name}.csv"
    frame.to_csv(csv, index=False)
    md = stage / f"{name}.md"
    lead = f"# {title}\n\n" + (f"{note}\n\n" if note else "")
    md.write_text(lead + markdown(frame if shown is None else shown))
    return [csv, md]


def _with_stars(frame: pd.DataFrame, columns: tuple[str, ...]) -> pd.DataFrame:
    """Table 2/3 layout: value followed by Holm stars for each non-CORD row."""
    shown = frame.copy()
    for column in columns:
        shown[column] = [
            f"{v:.4f}{rs.significance_stars(p) if np.isfinite(p) else ''}"
            for v, p in zip(frame[column], frame[f"p_{column}"], strict=True)]
    return shown.drop(columns=[f"p_{c}" for c in columns])


def write_report(cells: list[dict], failures: list[dict], out_dir,
                 n_bootstrap: int = N_BOOTSTRAP) -> list[Path]:
    """Write every table and figure into ``out_dir``; returns the written paths.

    Files are produced in a staging folder next to ``out_dir`` and moved in only when all
    of them exist, so a failure leaves the previous report (or nothing) in place.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        written = _write_all(cells, failures, stage, n_bootstrap)
        out.mkdir(parents=True, exist_ok=True)
        final = []
        for path in written:
            os.replace(path, out / path.name)
            final.append(out / path.name)
        return final
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _split_means(results: pd.DataFrame) -> str:
    """How many splits each cell averages, in words ("Five-split means" only when five)."""
    counts = results.groupby(["file", "calibrator"])["seed"].nunique()
    n = int(counts.max()) if len(counts) else 0
    if n == 1:
        return "One split per cell, no averaging"
    low = int(counts.min())
    return f"Means over {n} splits" if low == n else f"Means over {low}-{n} splits"


def _write_all(cells, failures, stage: Path, n_bootstrap: int) -> list[Path]:
    written: list[Path] = []
    results = results_frame(cells)
    results.to_csv(stage / "results.csv", index=False)
    written.append(stage / "results.csv")
    conditions = condition_means(results) if not results.empty else results
    if not conditions.empty and _datasets_with_conditions(conditions):
        written += _write_table(
            table1(conditions, n_bootstrap), stage, "table1_paired_reductions",
            "Table 1: mean paired reductions Base - Base+CORD",
            f"Positive = CORD improves. Intervals: percentile paired bootstrap over "
            f"conditions ({n_bootstrap} resamples), Bonferroni-adjusted so all intervals of "
            "the table hold jointly at 95%.")
        t2 = table2(conditions)
        written += _write_table(
            t2, stage, "table2_minimal_repair",
            "Table 2: CORD vs minimal repair (ECE %, NLL, Brier)",
            "Stars: CORD significantly lower (one-sided Wilcoxon signed-rank over conditions, "
            "Holm-adjusted over the table): * p<0.05, ** p<0.01, *** p<0.001. The CSV has "
            "the adjusted p-values.", shown=_with_stars(t2, ("ece", "nll", "brier")))
        t3 = table3(conditions)
        written += _write_table(
            t3, stage, "table3_mean_target",
            "Tables 3/10: mean-target ablation (ECE %, NLL, Brier, |mean s - mean b| pp)",
            "Stars: CORD significantly lower than the marked variant (Wilcoxon, Holm).",
            shown=_with_stars(t3, ("ece", "nll", "brier", "mean_gap_pp")))
        written += _write_table(table6(conditions), stage, "table6_local_weight",
                                "Table 6: sensitivity to the local weight lambda")
    tables7 = {}
    for dataset in sorted(set(results["dataset"])) if not results.empty else []:
        tables7[dataset] = table7(conditions, dataset)
        written += _write_table(tables7[dataset], stage, f"table7_{dataset}",
                                f"Tables 7/8: {dataset}, per classifier x calibrator",
                                f"{_split_means(results)}. dX = Base minus Uncal. for "
                                "accuracy, "
                                "Base minus Base+CORD for ECE/NLL/Brier.")
    agreement = agreement_table(tables7)
    if not agreement.empty:
        written += _write_table(agreement, stage, "agreement",
                                "Agreement with the paper's Tables 7/8 (matching cells)")
    size_rows = size_frame(cells)
    size_summary = size_table(size_rows)
    if not size_summary.empty:
        written += _write_table(size_summary, stage, "size_sensitivity",
                                "Calibration-size sensitivity (Figure 4 data)")
    timings = timings_table(cells)
    if not timings.empty:
        written += _write_table(timings, stage, "timings",
                                "Compute seconds per dataset and calibrator (summed)")
    workers = workers_table(cells)
    if not workers.empty:
        written += _write_table(workers, stage, "workers", "Tasks per Dask worker")
    if failures:
        written += _write_table(pd.DataFrame(failures), stage, "failures", "Failed tasks")
    if not conditions.empty:
        written.append(tradeoff_figure(conditions, stage / "figure2_tradeoff.png"))
        for dataset in sorted(set(results["dataset"])):
            written.append(reliability_figure(
                cells, dataset, stage / f"reliability_{dataset}.png"))
    if not size_summary.empty:
        written.append(size_figure(size_summary, stage / "figure4_size.png"))
    if not conditions.empty:
        written += _write_preserving(conditions, stage)
    return written


def _write_preserving(conditions: pd.DataFrame, stage: Path) -> list[Path]:
    """Tables 4, 11, 12 per dataset and Figure 1 (:mod:`flows.reproduce.preserving`)."""
    written = []
    for dataset in sorted(set(conditions["dataset"])):
        t4 = pp.table4(conditions, dataset)
        if not t4.empty:
            written += _write_table(
                t4, stage, f"table4_{dataset}",
                f"Table 4: fit-time vs post-fit prediction preservation, {dataset} "
                "(ECE / ECE_EM / smECE, %)",
                "Split means. Base-dagger: the non-preserving Base with the lowest value per "
                "classifier and metric; v / ^ = Base-dagger + CORD lower / higher than "
                "Base-dagger on the same splits. AdaTS needs penultimate features no logit "
                "file has (not reproduced).", shown=pp.shown(t4))
        t11 = pp.table11(conditions, dataset)
        if not t11.empty:
            written += _write_table(
                t11, stage, f"table11_{dataset}",
                f"Table 11: Table 4 extended to NLL and Brier, {dataset} "
                "(ECE %, NLL, Brier x 1e2; Base-dagger chosen by ECE)", shown=pp.shown(t11))
        t12 = pp.table12(conditions, dataset)
        if not t12.empty:
            written += _write_table(
                t12, stage, f"table12_{dataset}",
                f"Table 12: every Base calibrator and its CORD repair, {dataset} (%)")
    decomposition = pp.change_decomposition(conditions)
    if not decomposition.empty:
        written += _write_table(decomposition, stage, "figure1_changes",
                                "Figure 1 data: top-1 changes of Base by effect (%)")
        written.append(pp.change_figure(decomposition, stage / "figure1_changes.png",
                                        _figure))
    return written
