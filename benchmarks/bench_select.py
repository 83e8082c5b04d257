"""What ``--calibrator auto`` is worth: on every corpus entry (tests/corpus.py)
and the CIFAR sets in ../shared/data, the evaluation NLL (after CORD) of auto, of identity
and of every fixed family, and of the oracle (the family best on the evaluation split in
hindsight). Prints auto's regret to the oracle (median, 90th percentile, max, mean) against
each fixed family's mean regret, the entries where a family's champion would be worse than
uncalibrated, the same for the one-standard-error tie rule and for "lowest mean wins"
(``tie_se=0``, from the same folds), and auto's time against the forced families'.

    nice python benchmarks/bench_select.py                     # corpus + CIFAR
    nice python benchmarks/bench_select.py --no-cifar          # corpus only
    nice python benchmarks/bench_select.py --flow cifar100_resnet56   # + the flow timing

Splits: the corpus entries' own calibration/evaluation halves; CIFAR: the flow's seeded
split (seed 0, fraction 0.5). Auto follows the flow: the chosen family, or identity when
the chosen family's evaluation NLL is worse than uncalibrated (relative 1e-6, the gate's
tolerance). MS and Dir-ODIR are not fitted as fixed families at K = 100 (10,100
parameters: minutes per fit, and auto rules them out there). ``--flow STEM`` also times
``recalibrate`` in-process (temporary store) with ``auto`` and with ``vs`` on that file:
seconds in flow tasks, as the CLI's summary reports them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import corpus  # noqa: E402

from cord_ops import CORD, data, metrics  # noqa: E402
from cord_ops.calibrators import make_calibrator  # noqa: E402
from cord_ops.names import FAMILY_NAMES, IDENTITY  # noqa: E402
from cord_ops.select import choose, select_calibrator  # noqa: E402
from cord_ops.softmax import softmax  # noqa: E402

#: Near-tie rules compared on the same folds: (tie_se, identity_se) of cord_ops.select.choose.
RULES = {"1se": (1.0, 1.0), "lowest": (0.0, 0.0), "id1se": (0.0, 1.0),
         "half": (0.5, 0.5), "id2se": (0.0, 2.0)}
#: The rule cord_ops.select uses by default (the per-entry table shows it).
DEFAULT_RULE = "half"

#: The gate's relative tolerance for "no worse than uncalibrated".
HARM_TOLERANCE = 1e-6


def _case_from_corpus(e):
    def two(x):
        return x if e.columns > 1 else corpus._two_columns(x, e.kind)
    return (e.name, e.kind, two(e.cal_scores).astype(np.float64), e.cal_labels,
            two(e.eval_scores).astype(np.float64), e.eval_labels)


def _cases_from_cifar(folder: Path):
    for path in sorted(folder.glob("cifar*.npz")):
        ds = data.load(path, input_kind="logits")
        cal, ev = data.split(ds, 0, 0.5)
        yield path.stem, "logits", cal.scores, cal.labels, ev.scores, ev.labels


def _original(scores, kind):
    return softmax(scores) if kind == "logits" else scores


def _fit_eval(name, kind, cs, cy, es, ey):
    """(evaluation NLL after CORD, seconds to fit calibrator + CORD)."""
    start = time.perf_counter()
    cal = make_calibrator(name, input_kind=kind).fit(cs, cy)
    cord = CORD().fit(_original(cs, kind), cal.predict_proba(cs))
    seconds = time.perf_counter() - start
    repaired = cord.transform(_original(es, kind), cal.predict_proba(es))
    return metrics.nll(repaired, ey), seconds


def run_case(case):
    name, kind, cs, cy, es, ey = case
    k = cs.shape[1]
    uncal = metrics.nll(_original(es, kind), ey)
    nll, seconds = {}, {}
    for family in FAMILY_NAMES:
        if k >= 100 and family in ("ms", "dir-odir"):
            continue
        nll[family], seconds[family] = _fit_eval(family, kind, cs, cy, es, ey)
    start = time.perf_counter()
    selection = select_calibrator(cs, cy, kind, seed=0)
    select_seconds = time.perf_counter() - start
    auto = {}
    for rule, (tie_se, identity_se) in RULES.items():
        chosen, _ = choose({c.name: c.losses for c in selection.candidates}, tie_se,
                           identity_se)
        value = nll[chosen]
        fell_back = value > uncal + HARM_TOLERANCE * abs(uncal) and chosen != IDENTITY
        auto[rule] = {"chosen": chosen, "nll": nll[IDENTITY] if fell_back else value,
                      "fell_back": fell_back}
    return {"name": name, "k": k, "n_cal": len(cy), "uncal": uncal, "nll": nll,
            "seconds": seconds, "auto": auto, "select_seconds": select_seconds,
            "skipped": selection.skipped}


def _regret(value, best):
    return (value - best) / abs(best) if best != 0 else 0.0


def summarise(rows) -> str:
    out = []
    families = [f for f in FAMILY_NAMES]
    regrets = {f: [] for f in families}
    auto_regret = {rule: [] for rule in RULES}
    harms = {f: 0 for f in families}
    auto_harm = {rule: 0 for rule in RULES}
    out.append(f"{'entry':<44}{'K':>4}{'n_cal':>7}{'uncal':>9}{'oracle':>9}{'(family)':>10}"
               f"{'auto':>9}{'(chosen)':>12}{'regret%':>9}")
    for r in rows:
        best_family = min(r["nll"], key=r["nll"].get)
        best = r["nll"][best_family]
        for f in families:
            if f in r["nll"]:
                regrets[f].append(_regret(r["nll"][f], best))
                if r["nll"][f] > r["uncal"] + HARM_TOLERANCE * abs(r["uncal"]):
                    harms[f] += 1
        for rule in auto_regret:
            a = r["auto"][rule]
            auto_regret[rule].append(_regret(a["nll"], best))
            if a["nll"] > r["uncal"] + HARM_TOLERANCE * abs(r["uncal"]):
                auto_harm[rule] += 1
        a = r["auto"][DEFAULT_RULE]
        chosen = a["chosen"] + ("->id" if a["fell_back"] else "")
        out.append(f"{r['name'][:43]:<44}{r['k']:>4}{r['n_cal']:>7}{r['uncal']:>9.4f}"
                   f"{best:>9.4f}{best_family:>10}{a['nll']:>9.4f}{chosen:>12}"
                   f"{100 * _regret(a['nll'], best):>9.3f}")
    out.append("")
    for rule, (tie_se, identity_se) in RULES.items():
        label = f"auto {rule} (tie_se={tie_se:g}, identity_se={identity_se:g})"
        x = 100 * np.asarray(auto_regret[rule])
        out.append(f"{label}: regret to oracle median {np.median(x):.3f} %, p90 "
                   f"{np.percentile(x, 90):.3f} %, max {x.max():.3f} %, mean {x.mean():.3f} %;"
                   f" worse than uncalibrated on {auto_harm[rule]} of {len(x)} entries;"
                   f" fell back to identity on "
                   f"{sum(r['auto'][rule]['fell_back'] for r in rows)}")
    out.append("")
    out.append(f"{'fixed family':<14}{'mean regret %':>14}{'max %':>10}"
               f"{'worse than uncal':>18}{'entries':>9}")
    for f in families:
        x = 100 * np.asarray(regrets[f])
        if len(x):
            out.append(f"{f:<14}{x.mean():>14.3f}{x.max():>10.3f}{harms[f]:>18}{len(x):>9}")
    return "\n".join(out)


def timing(rows) -> str:
    out = ["", "time (calibrator + CORD fit on the calibration split; auto = CV + refit):"]
    for r in rows:
        if r["k"] < 10 and not r["name"].startswith("cifar"):
            continue
        if not r["name"].startswith("cifar"):
            continue
        chosen = r["auto"][DEFAULT_RULE]["chosen"]
        auto = r["select_seconds"] + r["seconds"][chosen]
        out.append(f"  {r['name']:<32} auto {auto:7.2f} s   vs {r['seconds']['vs']:6.2f} s   "
                   f"ts {r['seconds']['ts']:6.2f} s   sms {r['seconds']['sms']:6.2f} s   "
                   f"auto/vs {auto / max(r['seconds']['vs'], 1e-9):6.1f}x")
    corpus_rows = [r for r in rows if not r["name"].startswith("cifar")]
    if corpus_rows:
        total = sum(r["select_seconds"] for r in corpus_rows)
        vs = sum(r["seconds"]["vs"] for r in corpus_rows)
        out.append(f"  corpus ({len(corpus_rows)} entries): auto's CV {total:.1f} s in all, "
                   f"vs fits {vs:.1f} s in all")
    return "\n".join(out)


def flow_timing(stem: str, folder: Path) -> str:
    """``recalibrate`` in-process with auto and with vs: seconds in flow tasks."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect.testing.utilities import prefect_test_harness

    from flows.recalibrate.flow import recalibrate

    lines = ["", f"recalibrate on {stem} (in flow tasks, in-process, temporary store):"]
    with tempfile.TemporaryDirectory() as tmp, prefect_test_harness():
        uri = f"sqlite:///{tmp}/mlflow.db"
        seen = {}
        for calibrator in ("vs", "auto", "vs", "auto"):
            start = time.perf_counter()
            result = recalibrate(data=str(folder / f"{stem}.npz"), calibrator=calibrator,
                                 model_name=f"bench-{calibrator}-{len(seen)}",
                                 tracking_uri=uri)
            wall = time.perf_counter() - start
            tasks = sum(result.timings.values())
            seen.setdefault(calibrator, []).append(tasks)
            chosen = result.choice.family if result.choice is not None else calibrator
            lines.append(f"  --calibrator {calibrator:<5} {tasks:6.1f} s in flow tasks "
                         f"({result.timings.get('choose_family', 0.0):5.1f} s choosing), "
                         f"{wall:6.1f} s wall; fitted {chosen}")
        ratio = min(seen["auto"]) / min(seen["vs"])
        lines.append(f"  auto / vs (best of two each): {ratio:.2f}x")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--no-cifar", action="store_true")
    parser.add_argument("--no-corpus", action="store_true")
    parser.add_argument("--flow", default=None, metavar="STEM",
                        help="also time recalibrate (auto vs vs) on this CIFAR file")
    parser.add_argument("--json", type=Path, default=None, help="write every row here")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    print(f"load average at start: {os.getloadavg()}, cores: {os.cpu_count()}", flush=True)
    cases = []
    if not args.no_corpus:
        cases += [_case_from_corpus(e) for e in corpus.entries(include_one_column=True)]
    if not args.no_cifar and args.data_dir.exists():
        cases += list(_cases_from_cifar(args.data_dir))
    rows = []
    start = time.perf_counter()
    for case in cases:
        rows.append(run_case(case))
        r = rows[-1]
        print(f"  {r['name']}: auto {r['auto'][DEFAULT_RULE]['chosen']} "
              f"({r['select_seconds']:.1f} s)", file=sys.stderr, flush=True)
    print(summarise(rows))
    print(timing(rows))
    print(f"\n{len(rows)} entries in {time.perf_counter() - start:.0f} s")
    if args.flow:
        print(flow_timing(args.flow, args.data_dir), flush=True)
    print(f"load average at end: {os.getloadavg()}")
    if args.json:
        for r in rows:
            r["skipped"] = dict(r["skipped"])
        args.json.write_text(json.dumps(rows, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
