"""Expected NLLs for tests/calibrators/test_peer_agreement.py, from an actual probmetrics run.

Builds the suite's own miscalibrated classifier (tests/calibrators/synthetic.py, numpy
only), splits it as the peers did (seed s: ``perm = default_rng(s).permutation(n)``, first
half calibrates), feeds probmetrics' calibrators p0 = softmax(logits) as probabilities and
records the mean evaluation NLL (clipped below at float64 eps) over the seeds. Writes
tests/data/probmetrics_synthetic.json.

probmetrics (PyTorch-based) is not a dependency of cord-ops; run this in an environment of
its own:

    python3 -m venv /tmp/pm && /tmp/pm/bin/pip install probmetrics==1.3.0 numba numpy scikit-learn
    /tmp/pm/bin/python benchmarks/probmetrics_reference.py
"""

from __future__ import annotations

import json
import sys
import warnings
from importlib import metadata
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "calibrators"))
from synthetic import miscalibrated  # noqa: E402

#: The data: one classifier, N rows, K classes, SEEDS half/half splits.
DATA_SEED, N, K, SEEDS = 7, 2000, 6, 3
#: our name -> probmetrics' factory name (or class in ``probmetrics.calibrators.logistic``)
#: and options: the defaults the anchors' run used.
PEERS = {"ts": ("temp-scaling", {}), "vs": ("VectorScalingCalibrator", {}),
         "ms": ("MatrixScalingCalibrator", {}),
         "svs": ("svs", {"svs_print_init_info": False}),
         "sms": ("sms", {"sms_print_init_info": False})}
OUT = ROOT / "tests" / "data" / "probmetrics_synthetic.json"


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def nll(q: np.ndarray, y: np.ndarray) -> float:
    true = q[np.arange(y.shape[0]), y]
    return float(-np.mean(np.log(np.clip(true, np.finfo(np.float64).eps, None))))


def main() -> None:
    from probmetrics.calibrators import get_calibrator, logistic

    def build(theirs: str, options: dict):
        if theirs[0].isupper():  # not offered by the factory: the class itself
            return getattr(logistic, theirs)(**options)
        return get_calibrator(theirs, **options)

    logits, labels = miscalibrated(DATA_SEED, N, K)
    p0 = softmax(logits)
    results = {}
    for ours, (theirs, options) in PEERS.items():
        values = []
        for seed in range(SEEDS):
            perm = np.random.default_rng(seed).permutation(N)
            cal, ev = perm[: N // 2], perm[N // 2:]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fitted = build(theirs, options).fit(p0[cal], labels[cal])
            values.append(nll(np.asarray(fitted.predict_proba(p0[ev]), np.float64), labels[ev]))
        results[ours] = float(np.mean(values))
        print(f"{ours:4s} ({theirs}): mean evaluation NLL {results[ours]:.6f}")
    doc = {"generated_by": "python benchmarks/probmetrics_reference.py",
           "probmetrics": metadata.version("probmetrics"),
           "data": {"generator": "tests/calibrators/synthetic.py:miscalibrated",
                    "seed": DATA_SEED, "n": N, "k": K},
           "protocol": f"seeds 0..{SEEDS - 1}: perm = default_rng(seed).permutation(n), first "
                       "half calibrates, p0 = softmax(logits) fed as probabilities, NLL "
                       "clipped below at float64 eps, mean over seeds",
           "mean_nll": results}
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
