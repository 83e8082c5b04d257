"""Every calibrator on the corpus of real classifier outputs
(tests/corpus.py) -> NLL on the evaluation split uncalibrated, calibrated and after CORD,
TPCR before the repair (share of top-1 decisions the calibrator changed), ONNX parity
(max |graph - numpy| on the evaluation split, per graph dtype) and the gate's verdict on a
first version (no champion): whether it refuses the run for doing harm.

    python benchmarks/corpus_table.py                 # the covering subset (48 entries)
    python benchmarks/corpus_table.py --all           # every two-or-more-column entry
    python benchmarks/corpus_table.py --entries digits-gnb-logits-float64 --calibrators ts irm

Fits use tests/corpus.py's iteration caps (``corpus.FIT_OPTIONS``), as the corpus tests do.
Prints a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import corpus  # noqa: E402

from cord_ops import metrics  # noqa: E402
from cord_ops.calibrators import CALIBRATOR_NAMES  # noqa: E402
from onnx_export import export_onnx  # noqa: E402
from onnx_export.runtime import open_session  # noqa: E402


def gate_column(uncal_nll: float, cord_nll: float, cal_labels, eval_labels, k: int) -> str:
    """The gate's verdict on this run as a first version (no champion, TPCR 0, parity
    verified): ``refused: harm`` when ``flows.promotion.rules.decide`` says the repaired model is
    worse than the uncalibrated one (``decision.harms``), ``refused`` for another rule,
    ``promoted`` otherwise; ``n/a`` on a gate record without the uncalibrated
    baseline."""
    from flows.promotion import rules

    if "uncalibrated_nll" not in inspect.signature(rules.decide).parameters:
        return "n/a"
    evidence = rules.Evidence(rules.label_counts(cal_labels, k), rules.label_counts(eval_labels, k))
    decision = rules.decide(cord_nll, 0.0, True, None, uncalibrated_nll=uncal_nll,
                           evidence=evidence, policy=rules.Policy.for_classes(k))
    if decision.harms:
        return "refused: harm"
    return "promoted" if decision.promote else "refused"


def _parity(cal, cord, e, dtype: str) -> float:
    """max |graph - cord_ops| of every float output on the evaluation split cast to dtype."""
    x = e.eval_scores.astype(dtype)
    session = open_session(export_onnx(cal, cord, e.n_classes, input_kind=e.kind, dtype=dtype),
                           provider="cpu", threads=1)
    names = [o.name for o in session.get_outputs()]
    got = dict(zip(names, session.run(names, {"scores": x}), strict=True))
    xx = x.astype(np.float64)
    original = corpus.original_probs(xx, e.kind)
    calibrated = cal.predict_proba(xx)
    repaired = cord.transform(original, calibrated)
    expected = {"original": original, "calibrated": calibrated, "repaired": repaired}
    return max(float(np.max(np.abs(got[key].astype(np.float64) - value)))
               for key, value in expected.items())


def rows(entries, calibrators):
    for e in entries:
        p0 = e.eval_probs
        uncal = metrics.nll(p0, e.eval_labels)
        for name in calibrators:
            cal, cord = corpus.fitted(e.name, name)
            q = cal.predict_proba(e.eval_scores)
            repaired = cord.transform(p0, q)
            cord_nll = metrics.nll(repaired, e.eval_labels)
            yield {
                "entry": e.name, "calibrator": name, "K": e.n_classes,
                "uncal": uncal, "calibrated": metrics.nll(q, e.eval_labels), "cord": cord_nll,
                "tpcr": float(np.mean(corpus.top1(q) != corpus.top1(p0))),
                "f32": _parity(cal, cord, e, "float32"), "f64": _parity(cal, cord, e, "float64"),
                "gate": gate_column(uncal, cord_nll, e.cal_labels, e.eval_labels, e.n_classes),
            }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every entry, not the covering set")
    parser.add_argument("--entries", nargs="+", help="entry names (python tests/corpus.py)")
    parser.add_argument("--calibrators", nargs="+", default=list(CALIBRATOR_NAMES),
                        choices=CALIBRATOR_NAMES)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    chosen = ([corpus.entry(n) for n in args.entries] if args.entries
              else corpus.entries() if args.all else corpus.covering())
    print("| entry | calibrator | K | NLL uncal | NLL calibrated | NLL CORD | TPCR before "
          "repair | parity f32 | parity f64 | gate (first version) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    worse = 0
    for r in rows(chosen, args.calibrators):
        worse += r["cord"] > r["uncal"]
        print(f"| {r['entry']} | {r['calibrator']} | {r['K']} | {r['uncal']:.4f} | "
              f"{r['calibrated']:.4f} | {r['cord']:.4f} | {r['tpcr']:.4f} | {r['f32']:.2e} | "
              f"{r['f64']:.2e} | {r['gate']} |", flush=True)
    print(f"\n{len(chosen)} entries x {len(args.calibrators)} calibrators; CORD NLL above "
          f"uncalibrated in {worse} runs; {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
