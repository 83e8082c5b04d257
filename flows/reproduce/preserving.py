"""Fit-time versus post-fit prediction preservation: the paper's Table 4, its extensions
Tables 11 and 12, their CIFAR-100 analogues, and Figure 1 (change decomposition).

All functions take the split-averaged ``condition_means`` frame of a sweep (one row per
dataset x classifier x calibrator x report). Conventions (paper, Table 4 caption):

- the fit-time prediction-preserving baselines are TS, IRM, TS-TvA and MCCT-I, each
  reported as its direct output (TPCR 0 by construction). AdaTS is not reproduced: it needs
  the classifier's penultimate-layer features, which no logit file holds;
- Base-dagger is, per classifier and metric, the prediction-non-preserving Base with the
  lowest direct-output value; Base-dagger + CORD is its paired repair;
- a mark compares Base-dagger + CORD with Base-dagger on the same splits: "v" (the
  paper's green down-triangle) when the split-averaged value is lower, "^" when higher.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from flows.reproduce.defaults import NON_PRESERVING

#: Table 4's fit-time baselines that the logit files allow, in the paper's column order.
PRESERVING = ("ts", "irm", "ts-tva", "mcct-i")
TABLE4_METRICS = ("ece", "ece_em", "smece")
TABLE11_METRICS = ("ece", "nll", "brier")
_SCALE = {"ece": 100.0, "ece_em": 100.0, "smece": 100.0, "nll": 1.0, "brier": 100.0}

#: The paper's Table 4 (CIFAR-10, ECE / ECE_EM / smECE in %) for the five classifiers whose
#: logits we have; one line per classifier and column (Uncal., TS, IRM, AdaTS, TS-TvA,
#: MCCT-I, Base-dagger, Base-dagger + CORD).
_TABLE4 = """
vgg16_bn uncal 4.79 4.76 4.36
vgg16_bn ts 1.54 2.52 1.95
vgg16_bn irm 1.62 1.42 1.64
vgg16_bn adats 1.47 1.39 1.66
vgg16_bn ts-tva 1.73 2.55 2.02
vgg16_bn mcct-i 1.74 2.88 2.16
vgg16_bn base_dagger 1.46 1.36 1.63
vgg16_bn base_dagger_cord 1.41 1.30 1.61
resnet56 uncal 3.75 3.72 3.54
resnet56 ts 0.94 1.24 1.23
resnet56 irm 1.19 1.05 1.32
resnet56 adats 1.59 1.43 1.66
resnet56 ts-tva 1.02 1.15 1.24
resnet56 mcct-i 1.02 1.22 1.21
resnet56 base_dagger 0.94 0.88 1.20
resnet56 base_dagger_cord 0.92 0.88 1.13
mobilenetv2_x1_4 uncal 3.73 3.68 3.58
mobilenetv2_x1_4 ts 1.25 1.40 1.41
mobilenetv2_x1_4 irm 1.38 1.28 1.41
mobilenetv2_x1_4 adats 1.55 1.54 1.63
mobilenetv2_x1_4 ts-tva 1.22 1.33 1.38
mobilenetv2_x1_4 mcct-i 1.30 1.44 1.46
mobilenetv2_x1_4 base_dagger 1.20 1.23 1.36
mobilenetv2_x1_4 base_dagger_cord 1.22 1.18 1.35
shufflenetv2_x1_0 uncal 4.03 3.97 3.86
shufflenetv2_x1_0 ts 1.07 1.22 1.31
shufflenetv2_x1_0 irm 1.46 1.38 1.48
shufflenetv2_x1_0 adats 1.39 1.38 1.48
shufflenetv2_x1_0 ts-tva 1.02 1.15 1.29
shufflenetv2_x1_0 mcct-i 1.00 1.09 1.29
shufflenetv2_x1_0 base_dagger 1.06 1.01 1.27
shufflenetv2_x1_0 base_dagger_cord 1.04 1.05 1.25
repvgg_a1 uncal 3.49 3.44 3.31
repvgg_a1 ts 1.14 1.46 1.30
repvgg_a1 irm 1.30 1.08 1.34
repvgg_a1 adats 1.34 1.42 1.49
repvgg_a1 ts-tva 1.12 1.32 1.28
repvgg_a1 mcct-i 1.13 1.33 1.28
repvgg_a1 base_dagger 1.13 0.98 1.27
repvgg_a1 base_dagger_cord 1.10 0.95 1.23
"""
#: The paper's Table 11 (CIFAR-10, ECE % / NLL / Brier x 1e2, Base-dagger chosen by ECE).
_TABLE11 = """
vgg16_bn uncal 4.79 0.3353 10.56
vgg16_bn ts 1.54 0.2306 9.52
vgg16_bn irm 1.62 0.2286 9.27
vgg16_bn adats 1.47 0.2282 9.28
vgg16_bn ts-tva 1.73 0.2306 9.47
vgg16_bn mcct-i 1.74 0.2209 9.46
vgg16_bn base_dagger 1.46 0.2243 9.41
vgg16_bn base_dagger_cord 1.41 0.2241 9.40
resnet56 uncal 3.75 0.2525 9.39
resnet56 ts 0.94 0.1910 8.65
resnet56 irm 1.19 0.1917 8.60
resnet56 adats 1.59 0.1951 8.65
resnet56 ts-tva 1.02 0.1912 8.63
resnet56 mcct-i 1.02 0.1955 8.59
resnet56 base_dagger 0.94 0.1889 8.63
resnet56 base_dagger_cord 0.92 0.1888 8.63
mobilenetv2_x1_4 uncal 3.73 0.2509 9.77
mobilenetv2_x1_4 ts 1.25 0.2013 9.10
mobilenetv2_x1_4 irm 1.38 0.2008 9.04
mobilenetv2_x1_4 adats 1.55 0.1992 9.08
mobilenetv2_x1_4 ts-tva 1.22 0.2013 9.08
mobilenetv2_x1_4 mcct-i 1.30 0.1951 9.04
mobilenetv2_x1_4 base_dagger 1.20 0.1939 9.07
mobilenetv2_x1_4 base_dagger_cord 1.22 0.1935 9.03
shufflenetv2_x1_0 uncal 4.03 0.2839 10.91
shufflenetv2_x1_0 ts 1.07 0.2244 10.24
shufflenetv2_x1_0 irm 1.46 0.2305 10.29
shufflenetv2_x1_0 adats 1.39 0.2233 10.23
shufflenetv2_x1_0 ts-tva 1.02 0.2246 10.23
shufflenetv2_x1_0 mcct-i 1.00 0.2214 10.20
shufflenetv2_x1_0 base_dagger 1.06 0.2222 10.24
shufflenetv2_x1_0 base_dagger_cord 1.04 0.2220 10.23
repvgg_a1 uncal 3.49 0.2319 8.71
repvgg_a1 ts 1.14 0.1832 8.08
repvgg_a1 irm 1.30 0.1845 8.02
repvgg_a1 adats 1.34 0.1864 8.07
repvgg_a1 ts-tva 1.12 0.1832 8.05
repvgg_a1 mcct-i 1.13 0.1792 8.02
repvgg_a1 base_dagger 1.13 0.1768 8.02
repvgg_a1 base_dagger_cord 1.10 0.1765 8.00
"""
_PAPER_COLUMNS = ("uncal", "ts", "irm", "adats", "ts-tva", "mcct-i", "base_dagger",
                  "base_dagger_cord")


def _published(text: str) -> dict[str, dict[str, tuple[float, float, float]]]:
    """{classifier: {column: (three values)}} from lines "classifier column v v v"."""
    out: dict[str, dict[str, tuple[float, float, float]]] = {}
    for line in text.strip().splitlines():
        classifier, column, *values = line.split()
        out.setdefault(classifier, {})[column] = tuple(float(v) for v in values)
    return out


TABLE4_PAPER = _published(_TABLE4)
TABLE11_PAPER = _published(_TABLE11)


#: The paper's Table 12 (CIFAR-10, every Base calibrator: Base / Base + CORD in %, five-split
#: means) for the five classifiers whose logits we have; one line per classifier and metric,
#: the calibrators in ``_TABLE12_ORDER``, each as Base then + CORD (marks dropped).
_TABLE12 = """
vgg16_bn ece 1.455 1.413 1.563 1.609 1.524 1.409 1.545 1.558 1.799 1.695 1.703 1.681 1.589 1.587
vgg16_bn ece_em 1.914 1.870 2.475 2.471 2.012 1.784 2.040 2.007 2.147 2.023 1.492 1.434 1.360 1.295
vgg16_bn smece 1.640 1.603 1.995 1.995 1.682 1.558 1.719 1.709 1.848 1.780 1.695 1.679 1.628 1.606
resnet56 ece 1.003 0.948 0.943 0.924 1.120 0.849 0.998 0.988 1.007 0.934 1.329 1.340 1.110 1.104
resnet56 ece_em 1.215 1.081 1.332 1.282 1.379 0.965 1.252 1.119 1.224 1.057 0.962 0.959 0.884 0.875
resnet56 smece 1.196 1.132 1.246 1.230 1.304 1.148 1.229 1.197 1.204 1.136 1.315 1.309 1.225 1.225
mobilenetv2_x1_4 ece 1.224 1.201 1.309 1.259 1.501 1.162 1.198 1.220 1.416 1.321 1.446 1.471 1.344 1.304
mobilenetv2_x1_4 ece_em 1.434 1.270 1.541 1.467 1.698 1.193 1.485 1.339 1.603 1.338 1.331 1.329 1.126 1.183
mobilenetv2_x1_4 smece 1.357 1.345 1.470 1.466 1.568 1.382 1.429 1.411 1.526 1.429 1.541 1.531 1.398 1.365
shufflenetv2_x1_0 ece 1.058 1.035 1.101 1.084 1.225 1.129 1.095 1.076 1.110 1.163 1.518 1.404 1.204 1.170
shufflenetv2_x1_0 ece_em 1.085 1.105 1.190 1.163 1.232 1.191 1.087 1.119 1.114 1.099 1.244 1.231 1.007 1.046
shufflenetv2_x1_0 smece 1.352 1.346 1.326 1.300 1.389 1.315 1.290 1.279 1.304 1.282 1.506 1.497 1.273 1.252
repvgg_a1 ece 1.177 1.134 1.155 1.140 1.321 1.128 1.134 1.097 1.250 1.004 1.488 1.435 1.285 1.244
repvgg_a1 ece_em 1.384 1.269 1.431 1.381 1.528 1.146 1.368 1.256 1.553 1.234 1.143 1.067 0.981 0.949
repvgg_a1 smece 1.282 1.217 1.287 1.284 1.391 1.239 1.266 1.231 1.359 1.219 1.463 1.406 1.344 1.303
"""  # noqa: E501
_TABLE12_ORDER = ("vs", "svs", "ms", "sms", "dir-odir", "irova", "irova-ts")


def _published12(text: str) -> dict[tuple[str, str], dict[str, tuple[float, float]]]:
    """{(classifier, metric): {calibrator: (Base, Base + CORD)}}."""
    out: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}
    for line in text.strip().splitlines():
        classifier, metric, *values = line.split()
        numbers = [float(v) for v in values]
        out[(classifier, metric)] = {
            name: (numbers[2 * i], numbers[2 * i + 1]) for i, name in enumerate(_TABLE12_ORDER)}
    return out


TABLE12_PAPER = _published12(_TABLE12)


def _by(conditions: pd.DataFrame, dataset: str) -> pd.DataFrame:
    rows = conditions[conditions["dataset"] == dataset]
    return rows.set_index(["classifier", "calibrator", "report"]).sort_index()


def mark(base: float, repaired: float) -> str:
    """The paired mark of a repair against its Base: "v" lower, "^" higher, "" equal."""
    if not (np.isfinite(base) and np.isfinite(repaired)) or repaired == base:
        return ""
    return "v" if repaired < base else "^"


def _value(frame: pd.DataFrame, classifier: str, calibrator: str, report: str,
           metric: str) -> float:
    try:
        return float(frame.loc[(classifier, calibrator, report), metric]) * _SCALE[metric]
    except KeyError:
        return float("nan")


def _dagger(frame: pd.DataFrame, classifier: str, metric: str) -> str | None:
    """The non-preserving calibrator with the lowest direct-output ``metric``."""
    values = {c: _value(frame, classifier, c, "base", metric) for c in NON_PRESERVING}
    values = {c: v for c, v in values.items() if np.isfinite(v)}
    return min(values, key=values.get) if values else None


def comparison_table(conditions: pd.DataFrame, dataset: str, metrics: tuple[str, ...],
                     select_by: str | None = None,
                     published: dict | None = None) -> pd.DataFrame:
    """Tables 4 / 11: one row per classifier and metric. Columns: Uncal., each fit-time
    baseline, Base-dagger (its name and value), Base-dagger + CORD and its mark, then the
    paper's values (``paper_*``) where it has that classifier. Base-dagger is chosen per
    metric, or by ``select_by`` for every metric (Table 11: by ECE)."""
    frame = _by(conditions, dataset)
    if frame.empty:
        return pd.DataFrame()
    classifiers = sorted(set(frame.index.get_level_values("classifier")))
    rows = []
    for classifier in classifiers:
        theirs = (published or {}).get(classifier)
        for k, metric in enumerate(metrics):
            dagger = _dagger(frame, classifier, select_by or metric)
            uncal = [_value(frame, classifier, c, "uncal", metric)
                     for c in (*NON_PRESERVING, *PRESERVING)]
            uncal = [v for v in uncal if np.isfinite(v)]
            row = {"classifier": classifier, "metric": metric,
                   "uncal": uncal[0] if uncal else np.nan}
            for calibrator in PRESERVING:
                row[calibrator] = _value(frame, classifier, calibrator, "base", metric)
            base = _value(frame, classifier, dagger, "base", metric) if dagger else np.nan
            cord = _value(frame, classifier, dagger, "cord", metric) if dagger else np.nan
            row.update({"base_dagger": dagger or "", "base_dagger_value": base,
                        "base_dagger_cord": cord, "mark": mark(base, cord)})
            if theirs:
                for column in _PAPER_COLUMNS:
                    row[f"paper_{column}"] = theirs[column][k]
            rows.append(row)
    return pd.DataFrame(rows)


def table4(conditions: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """Table 4 (ECE, ECE_EM, smECE in %) for ``dataset``; the paper's values for CIFAR-10."""
    return comparison_table(conditions, dataset, TABLE4_METRICS,
                            published=TABLE4_PAPER if dataset == "cifar10" else None)


def table11(conditions: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """Table 11 (ECE %, NLL, Brier x 1e2) with Base-dagger selected by standard ECE."""
    return comparison_table(conditions, dataset, TABLE11_METRICS, select_by="ece",
                            published=TABLE11_PAPER if dataset == "cifar10" else None)


def table12(conditions: pd.DataFrame, dataset: str) -> pd.DataFrame:
    """Table 12: per classifier and metric (ECE, ECE_EM, smECE in %), every Base
    calibrator's direct output and its CORD repair with the paired mark; on CIFAR-10 also
    the paper's pair (``paper_<calibrator>``, ``paper_<calibrator>+cord``) where it has
    the classifier."""
    frame = _by(conditions, dataset)
    if frame.empty:
        return pd.DataFrame()
    published = TABLE12_PAPER if dataset == "cifar10" else {}
    rows = []
    for classifier in sorted(set(frame.index.get_level_values("classifier"))):
        for metric in TABLE4_METRICS:
            dagger = _dagger(frame, classifier, metric)
            row = {"classifier": classifier, "metric": metric, "base_dagger": dagger or ""}
            theirs = published.get((classifier, metric), {})
            for calibrator in NON_PRESERVING:
                base = _value(frame, classifier, calibrator, "base", metric)
                cord = _value(frame, classifier, calibrator, "cord", metric)
                row[f"{calibrator}"] = base
                row[f"{calibrator}+cord"] = cord
                row[f"{calibrator}_mark"] = mark(base, cord)
                if theirs:
                    paper_base, paper_cord = theirs.get(calibrator, (np.nan, np.nan))
                    row[f"paper_{calibrator}"] = paper_base
                    row[f"paper_{calibrator}+cord"] = paper_cord
            rows.append(row)
    return pd.DataFrame(rows)


def change_decomposition(conditions: pd.DataFrame) -> pd.DataFrame:
    """Figure 1's data: per dataset and Base calibrator, the classifier- and split-averaged
    shares (% of evaluation rows) of top-1 changes that fix an error (C+), make one (C-) or
    swap one wrong class for another (C0); C+ - C- is the accuracy change, their sum TPCR."""
    base = conditions[(conditions["report"] == "base")
                      & conditions["calibrator"].isin(NON_PRESERVING)].copy()
    if base.empty or "c_plus" not in base:
        return pd.DataFrame()
    changed = base[["c_plus", "c_minus", "c_zero"]].sum(axis=1)
    share = np.where(changed > 0, 100 * base["tpcr"] / changed.where(changed > 0, 1), 0.0)
    for key in ("c_plus", "c_minus", "c_zero"):
        base[f"{key}_pct"] = base[key] * share
    base["tpcr_pct"] = 100 * base["tpcr"]
    base["d_acc_pp"] = base["c_plus_pct"] - base["c_minus_pct"]
    columns = ["c_plus_pct", "c_minus_pct", "c_zero_pct", "tpcr_pct", "d_acc_pp"]
    out = base.groupby(["dataset", "calibrator"])[columns].mean().reset_index()
    order = {c: i for i, c in enumerate(NON_PRESERVING)}
    out["_order"] = out["calibrator"].map(order)
    return out.sort_values(["dataset", "_order"]).drop(columns="_order")


def change_figure(decomposition: pd.DataFrame, path: Path, figure) -> Path:
    """Figure 1: stacked bars C+ (green), C- (red), C0 (grey) per Base calibrator, one panel
    per dataset, with the accuracy change C+ - C- as a black tick. ``figure`` is the
    report's Agg figure factory."""
    datasets = sorted(set(decomposition["dataset"]))
    fig, axes = figure(1, len(datasets), 4.6, 3.4)
    for ax, dataset in zip(axes[0], datasets, strict=True):
        rows = decomposition[decomposition["dataset"] == dataset]
        x = np.arange(len(rows))
        plus, minus, zero = (rows[c].to_numpy() for c in
                             ("c_plus_pct", "c_minus_pct", "c_zero_pct"))
        ax.bar(x, plus, color="#2e8b57", label="C+ (error fixed)")
        ax.bar(x, minus, bottom=plus, color="#c0392b", label="C- (error made)")
        ax.bar(x, zero, bottom=plus + minus, color="0.6", label="C0 (wrong -> wrong)")
        ax.scatter(x, rows["d_acc_pp"], marker="_", s=200, color="black", zorder=3,
                   label="accuracy change (pp)")
        ax.axhline(0.0, color="black", linewidth=0.6)
        ax.set_xticks(x, rows["calibrator"], rotation=45, fontsize=8)
        ax.set_ylabel("% of evaluation rows")
        ax.set_title(dataset, fontsize=9)
    # One legend below the panels: inside an axes it covered the first calibrator's bar.
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=7,
               frameon=False)
    fig.suptitle("Top-1 changes of Base against the original predictions (TPCR = C+ + C- + C0)",
                 fontsize=10)
    fig.tight_layout(rect=(0.0, 0.08, 1.0, 1.0))
    fig.savefig(path)
    return path


def shown(table: pd.DataFrame) -> pd.DataFrame:
    """The Markdown view of Tables 4 / 11: Base-dagger + CORD with its mark appended."""
    out = table.copy()
    if "mark" in out:
        out["base_dagger_cord"] = [f"{v:.2f} {m}".strip() if np.isfinite(v) else ""
                                   for v, m in zip(out["base_dagger_cord"], out["mark"],
                                                   strict=True)]
        out = out.drop(columns="mark")
    return out
