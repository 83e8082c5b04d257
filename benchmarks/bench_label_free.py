"""How far the label-free estimates of ``cord-ops monitor`` are from the accuracy that the
labels later show, and how often it alarms, on the shared CIFAR logits and the test corpus.

Protocol, per model: calibration / reference / pool splits of 40 / 30 / 30 % (one fixed
permutation). The champion is what ``cord-ops recalibrate`` fits (vector scaling, then
CORD, on the calibration split); its reference profile is fitted on the reference split.
Batches of ``--batch`` rows (at most the pool's size) are drawn from the pool:

- (i) at random, without replacement (so a batch is an independent sample, as the drift
  tests assume; at most two thirds of the pool);
- (ii) with class priors drawn from a Dirichlet of concentration 1 or 0.3 (per class, rows
  with replacement);
- (iii) selected by confidence: rows drawn with weight (1.05 - raw top-1 probability)^2,
  a covariate-like shift towards hard inputs;
- (iv) ``predicted-shift``: the shares of the champion's predicted classes drawn from a
  Dirichlet of concentration 1 over the classes it predicts on the pool, rows drawn per
  predicted class with replacement (a batch that predicts more of one class;
  each predicted class keeps its rows' distribution).

For each batch: |estimate - realised accuracy| of raw CBPE (the classifier's own
probabilities), the champion's mean top-1 probability (``mean_conf``, CBPE without the
reference split's isotonic maps), CBPE on the champion (``cbpe``: as ``cord-ops monitor``
estimates it, with the classifier's own probabilities beside the champion's, so the recipe
is chosen per model between the per-predicted-class maps and the one-vs-rest calibration,
``cord_ops.label_free``; ``cbpe_class``: the per-predicted-class maps alone, and
``prior_class`` the prior-corrected estimate beside them: both the estimates before the
recipe was chosen;
``cbpe_pooled``: one map pooled over the predicted classes, the estimate without per-class maps),
ATC, DoC and CBPE after the EM prior correction; ``ref_floor``, the floor of every
label-shift estimate whose per-class accuracies come from the labelled reference split (the
batch's exact label shares times the reference's per-class accuracy: what is left is the
difference between the reference's and the pool's rows of each class); ``oracle``, which is
no estimator but the floor of label-shift estimation: the accuracy of a batch whose label
shares are known exactly and whose per-class accuracy is the pool's (sum over classes of
batch share x pool accuracy of the class), so what is left is the batch's own sampling
noise; and whether ``flows.monitor.label_free.records.alert_reasons`` alarms at the default
thresholds (false alarms on (i), detection on (ii)-(iv)). NannyML's CBPE (accuracy, its own
isotonic calibration on the reference split's raw probabilities, defaults otherwise) runs on
the same batches in the interpreter ``--nannyml PYTHON`` names, or in this one when it has
nannyml installed; otherwise its column is skipped with a message. With it, each group's
table is followed by ``wins``: the share of batches on which cord-ops's ``cbpe`` is at least
as close to the realised accuracy as NannyML's.

Models: the shared CIFAR logits, the test corpus (``tests/corpus.py``: scikit-learn's
bundled data sets, pools of at most 360 rows), the ``imbalanced binary`` group
(20,000 generated rows of 1, 2.8 or 5 % positives; class-balanced logistic regression and
gradient boosting, which predict the rare class several times too often, most of those
predictions wrong; pools of 6,000 rows) and, with ``--large``, the corpus's model
families on two generated 20,000-row data sets (``corpus.LARGE_SOURCES``, pools of 6,000
rows), where batches of 2,000 rows fit as on CIFAR.

Usage: python benchmarks/bench_label_free.py [--repeats 40] [--batch 2000] [--no-corpus]
       [--large] [--no-imbalanced] [--files cifar10_resnet56 ...]
       [--groups cifar100 cifar10 corpus imbalanced large]
       [--nannyml /path/to/python]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cord_ops import CORD
from cord_ops import label_free as lf
from cord_ops.calibrators import make_calibrator
from cord_ops.softmax import softmax
from flows.monitor.label_free.records import Thresholds, alert_reasons

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
ESTIMATORS = ("cbpe_raw", "mean_conf", "cbpe", "cbpe_class", "cbpe_pooled", "atc", "doc",
              "cbpe_prior", "prior_class", "ref_floor", "oracle")
GROUPS = ("cifar100", "cifar10", "corpus", "imbalanced", "large")
SCENARIOS = ("random", "dirichlet-1", "dirichlet-0.3", "confidence", "predicted-shift")
#: The imbalanced binary group: positive shares and the class-balanced models.
RARE_SHARES = (0.01, 0.028, 0.05)
RARE_MODELS = ("logreg", "gb")
#: What each alarm reason starts with (flows.monitor.label_free.records.alert_reasons).
CAUSES = {"ks": "ks drift", "chi2": "chi2 drift", "accuracy": "estimated accuracy",
          "priors": "class priors moved"}


def champion(scores, labels, kind: str, calibrator: str = "vs"):
    """(fitted calibrator, fitted CORD) as ``recalibrate --calibrator`` fits them."""
    cal = make_calibrator(calibrator, input_kind=kind).fit(scores, labels)
    p0 = softmax(scores) if kind == "logits" else scores / scores.sum(axis=1, keepdims=True)
    cord = CORD().fit(p0, cal.predict_proba(scores))
    return cal, cord


def outputs(cal, cord, scores, kind: str):
    p0 = softmax(scores) if kind == "logits" else scores / scores.sum(axis=1, keepdims=True)
    return p0, cord.transform(p0, cal.predict_proba(scores))


def draw(rng, scenario: str, labels: np.ndarray, raw_conf: np.ndarray, size: int,
         predicted: np.ndarray):
    n = len(labels)
    if scenario == "random":
        return rng.choice(n, size=min(size, 2 * n // 3), replace=False)
    if scenario.startswith("dirichlet"):
        alpha = float(scenario.split("-")[1])
        present = np.unique(labels)
        priors = rng.dirichlet(np.full(present.size, alpha))
        counts = rng.multinomial(size, priors)
        return np.concatenate([rng.choice(np.flatnonzero(labels == c), size=m, replace=True)
                               for c, m in zip(present, counts, strict=True) if m])
    if scenario == "predicted-shift":
        present = np.unique(predicted)
        counts = rng.multinomial(size, rng.dirichlet(np.ones(present.size)))
        return np.concatenate([rng.choice(np.flatnonzero(predicted == c), size=m, replace=True)
                               for c, m in zip(present, counts, strict=True) if m])
    weights = (1.05 - raw_conf) ** 2
    return rng.choice(n, size=size, replace=True, p=weights / weights.sum())


def run_model(name: str, scores, labels, kind: str, repeats: int, batch: int, rng,
              nannyml_jobs: list | None, calibrator: str = "vs") -> dict:
    k = int(labels.max()) + 1
    perm = np.random.default_rng(0).permutation(len(labels))
    a, b = int(0.4 * len(labels)), int(0.7 * len(labels))
    cal_i, ref_i, pool_i = perm[:a], perm[a:b], perm[b:]
    cal, cord = champion(scores[cal_i], labels[cal_i], kind, calibrator)
    ref_p0, ref_q = outputs(cal, cord, scores[ref_i], kind)
    profile = lf.ReferenceProfile().fit(ref_q, labels[ref_i], ref_p0)
    by_class = lf.ReferenceProfile(recipe=lf.CLASS_MAPS).fit(ref_q, labels[ref_i], ref_p0)
    pooled = lf.ReferenceProfile(min_map_rows=np.inf).fit(ref_q, labels[ref_i]).maps_
    pool_p0, pool_q = outputs(cal, cord, scores[pool_i], kind)
    pool_y = labels[pool_i]
    pool_top1 = pool_q.argmax(axis=1)
    raw_conf = pool_p0.max(axis=1)
    pool_correct = pool_p0.argmax(axis=1) == pool_y
    present = np.unique(pool_y)
    class_accuracy = np.array([pool_correct[pool_y == c].mean() for c in present])
    reference_accuracy = profile.class_accuracy_[present]
    size = min(batch, len(pool_i))
    thresholds = Thresholds()
    errors = {s: {e: [] for e in ESTIMATORS} for s in SCENARIOS}
    signed = {s: [] for s in SCENARIOS}
    alarms = {s: 0 for s in SCENARIOS}
    causes = {s: dict.fromkeys(CAUSES, 0) for s in SCENARIOS}
    for scenario in SCENARIOS:
        for _ in range(repeats):
            rows = draw(rng, scenario, pool_y, raw_conf, size, pool_top1)
            est = profile.estimate(pool_q[rows], pool_p0[rows])
            by_class_est = by_class.estimate(pool_q[rows], pool_p0[rows])
            realised = float(np.mean(pool_correct[rows]))
            shares = np.array([np.mean(pool_y[rows] == c) for c in present])
            values = {"cbpe_raw": lf.cbpe_accuracy(pool_p0[rows]),
                      "mean_conf": est.mean_confidence, "cbpe": est.cbpe,
                      "cbpe_class": by_class_est.cbpe, "prior_class": by_class_est.prior_corrected,
                      "cbpe_pooled": float(pooled.predict(pool_top1[rows],
                                                          pool_q[rows].max(axis=1)).mean()),
                      "atc": est.atc, "doc": est.doc, "cbpe_prior": est.prior_corrected,
                      "ref_floor": float(shares @ reference_accuracy),
                      "oracle": float(shares @ class_accuracy)}
            for e in ESTIMATORS:
                errors[scenario][e].append(abs(values[e] - realised))
            signed[scenario].append(est.cbpe - realised)
            reasons = alert_reasons(est, profile, thresholds)
            alarms[scenario] += bool(reasons)
            for cause, prefix in CAUSES.items():
                causes[scenario][cause] += any(r.startswith(prefix) for r in reasons)
            if nannyml_jobs is not None:
                nannyml_jobs.append({"model": name, "scenario": scenario,
                                     "rows": rows.tolist(), "realised": realised})
    if nannyml_jobs is not None:
        nannyml_jobs.append({"model": name, "reference": True,
                             "p0": ref_p0.tolist(), "y": labels[ref_i].tolist(),
                             "pool_p0": pool_p0.tolist()})
    return {"model": name, "k": k, "batch": size, "recipe": profile.recipe_,
            "error": {s: {e: float(np.mean(v)) for e, v in errors[s].items()}
                      for s in SCENARIOS},
            "cbpe_signed": signed,
            "alarm_rate": {s: alarms[s] / repeats for s in SCENARIOS},
            "cause_rate": {s: {c: v / repeats for c, v in causes[s].items()} for s in SCENARIOS}}


def cifar_models(files):
    for path in sorted(DATA.glob("cifar*.npz")):
        if files and path.stem not in files:
            continue
        with np.load(path, allow_pickle=False) as f:
            yield path.stem, f["logits"].astype(np.float64), f["labels"].astype(np.int64), \
                "logits"


def corpus_models(large: bool = False):
    sys.path.insert(0, str(ROOT))
    from tests import corpus

    for e in corpus.entries(dtype="float64", large=large):
        scores = np.concatenate([e.cal_scores, e.eval_scores]).astype(np.float64)
        labels = np.concatenate([e.cal_labels, e.eval_labels])
        if len(labels) >= 500:  # a pool of at least 150 rows
            yield e.name, scores, labels, e.kind


def imbalanced_models():
    """The over-predicting binary case, generated: 20,000 rows of ``RARE_SHARES`` positives, 3-fold
    out-of-fold probabilities of class-balanced models (which over-predict the rare class)."""
    from sklearn.datasets import make_classification
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict

    makers = {"logreg": lambda: LogisticRegression(class_weight="balanced", max_iter=500),
              "gb": lambda: HistGradientBoostingClassifier(class_weight="balanced",
                                                           max_iter=50, random_state=0)}
    for share in RARE_SHARES:
        x, y = make_classification(n_samples=20000, n_features=10, n_informative=4,
                                   weights=[1 - share], flip_y=0.0, class_sep=0.7,
                                   random_state=0)
        for model in RARE_MODELS:
            probs = cross_val_predict(makers[model](), x, y, method="predict_proba",
                                      cv=StratifiedKFold(3, shuffle=True, random_state=0))
            yield f"rare{share:g}_{model}", probs, y.astype(np.int64), "probs"


NANNYML_SCRIPT = r"""
import json, sys, warnings
import numpy as np, pandas as pd
import nannyml as nml
warnings.filterwarnings("ignore")
jobs = json.load(open(sys.argv[1]))
refs = {j["model"]: j for j in jobs if j.get("reference")}
out = {}
for model, ref in refs.items():
    p0, y, pool = np.array(ref["p0"]), np.array(ref["y"]), np.array(ref["pool_p0"])
    k = p0.shape[1]
    def frame(p, labels=None):
        d = {f"p{c}": p[:, c] for c in range(k)}
        d["pred"] = p.argmax(1)
        if labels is not None:
            d["y"] = labels
        return pd.DataFrame(d)
    kw = dict(y_pred="pred", y_true="y", metrics=["accuracy"], chunk_number=1)
    if k == 2:
        est = nml.CBPE(y_pred_proba="p1", problem_type="classification_binary", **kw)
    else:
        est = nml.CBPE(y_pred_proba={c: f"p{c}" for c in range(k)},
                       problem_type="classification_multiclass", **kw)
    est.fit(frame(p0, y))
    errs = {}
    for job in jobs:
        if job.get("reference") or job["model"] != model:
            continue
        res = est.estimate(frame(pool[np.array(job["rows"])])).to_df()
        value = float(res[("accuracy", "value")].iloc[-1])
        errs.setdefault(job["scenario"], []).append(value - job["realised"])
    out[model] = errs
print(json.dumps(out))
"""


def nannyml_python(named: str | None) -> str | None:
    """The interpreter that runs NannyML: ``--nannyml``, else this one when it has
    nannyml; None (with a message) when neither."""
    import importlib.util

    if named:
        return named
    if importlib.util.find_spec("nannyml") is not None:
        return sys.executable
    print("NannyML is not installed here and --nannyml names no interpreter that has it: "
          "its column is skipped (pip install nannyml into a separate environment and pass "
          "--nannyml /that/env/bin/python; it is no dependency of cord-ops)")
    return None


def run_nannyml(python: str, jobs: list) -> dict:
    """Per model and scenario, NannyML's signed errors (estimate - realised), in the
    order of the batches."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "jobs.json"
        path.write_text(json.dumps(jobs))
        done = subprocess.run([python, "-c", NANNYML_SCRIPT, str(path)], capture_output=True,
                              text=True, timeout=3600)
    if done.returncode:
        print(f"nannyml failed: {done.stderr[-2000:]}")
        return {}
    return json.loads(done.stdout.strip().splitlines()[-1])


def wins(rows: list[dict], nannyml: dict) -> str:
    """How often cord-ops's CBPE is at least as close to the realised accuracy as
    NannyML's, per scenario and overall."""
    parts, total, won = [], 0, 0
    for s in SCENARIOS:
        ours = np.abs(np.concatenate([r["cbpe_signed"][s] for r in rows]))
        theirs = np.abs(np.concatenate([nannyml[r["model"]][s] for r in rows]))
        parts.append(f"{s} {int(np.sum(ours <= theirs))}/{ours.size}")
        total, won = total + ours.size, won + int(np.sum(ours <= theirs))
    return f"wins (cbpe at least as close as nannyml): {won}/{total}; " + ", ".join(parts)


def table(rows: list[dict], nannyml: dict, label: str) -> None:
    print(f"\n{label}: mean |estimate - realised accuracy| in points, alarm rate in %")
    head = "scenario        " + "".join(f"{e:>12}" for e in ESTIMATORS)
    print(head + ("    nannyml" if nannyml else "") + "   alarms  " +
          " ".join(f"{c:>8}" for c in CAUSES))
    for s in SCENARIOS:
        means = [100 * np.mean([r["error"][s][e] for r in rows]) for e in ESTIMATORS]
        line = f"{s:<16}" + "".join(f"{m:>12.2f}" for m in means)
        if nannyml:
            theirs = [np.mean(np.abs(nannyml[r["model"]][s])) for r in rows]
            line += f"{100 * np.mean(theirs):>11.2f}"
        line += f"{100 * np.mean([r['alarm_rate'][s] for r in rows]):>9.1f}  "
        line += " ".join(f"{100 * np.mean([r['cause_rate'][s][c] for r in rows]):>8.1f}"
                         for c in CAUSES)
        print(line)
    if nannyml:
        print(wins(rows, nannyml))
    recipes = [r["recipe"] for r in rows]
    print(f"cbpe's recipe: {recipes.count(lf.ONE_VS_REST)} of {len(rows)} models "
          f"{lf.ONE_VS_REST}, the others {lf.CLASS_MAPS}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--files", nargs="*")
    parser.add_argument("--no-corpus", action="store_true")
    parser.add_argument("--large", action="store_true",
                        help="also the 20,000-row generated tabular outputs")
    parser.add_argument("--calibrator", default="vs",
                        help="the champion's calibrator (recalibrate's --calibrator) [vs]")
    parser.add_argument("--no-imbalanced", action="store_true",
                        help="leave out the generated imbalanced binary group")
    parser.add_argument("--nannyml", help="python interpreter with nannyml installed "
                        "[this one, if it has nannyml]")
    parser.add_argument("--groups", nargs="*", choices=GROUPS,
                        help="only these groups (the others' batches are not drawn, so a "
                        "group's batches differ from a full run's) [cifar100 cifar10 corpus "
                        "imbalanced, and large with --large]")
    parser.add_argument("--json", type=Path, help="also write the per-model figures here")
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()}, repeats {args.repeats}, batch {args.batch}, "
          f"champion {args.calibrator} + CORD")
    started = time.perf_counter()
    rng = np.random.default_rng(1)
    groups = {}
    python = nannyml_python(args.nannyml)
    jobs = [] if python else None
    wanted = set(args.groups or GROUPS)
    if DATA.is_dir():
        for name, scores, labels, kind in cifar_models(args.files):
            group = "CIFAR-100" if name.startswith("cifar100") else "CIFAR-10"
            if group.lower().replace("-", "") not in wanted:
                continue
            groups.setdefault(group, []).append(
                run_model(name, scores, labels, kind, args.repeats, args.batch, rng, jobs,
                         args.calibrator))
    else:
        print(f"{DATA}: not found, CIFAR skipped")
    if not args.no_corpus and "corpus" in wanted:
        for name, scores, labels, kind in corpus_models():
            groups.setdefault("corpus", []).append(
                run_model(name, scores, labels, kind, args.repeats, args.batch, rng, jobs,
                         args.calibrator))
    if not args.no_imbalanced and "imbalanced" in wanted:
        for name, scores, labels, kind in imbalanced_models():
            groups.setdefault("imbalanced binary", []).append(
                run_model(name, scores, labels, kind, args.repeats, args.batch, rng, jobs,
                         args.calibrator))
    if args.large and "large" in wanted:
        for name, scores, labels, kind in corpus_models(large=True):
            groups.setdefault("tabular 20k", []).append(
                run_model(name, scores, labels, kind, args.repeats, args.batch, rng, jobs,
                         args.calibrator))
    nannyml = run_nannyml(python, jobs) if python else {}
    for group, rows in groups.items():
        table(rows, nannyml, f"{group} ({len(rows)} models)")
    if args.json:
        args.json.write_text(json.dumps({"groups": groups, "nannyml": nannyml}, indent=1))
    print(f"\n{time.perf_counter() - started:.0f} s; load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
