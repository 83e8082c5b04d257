"""MS and Dir-ODIR with default settings converge on a scikit-learn classifier trained on
tabular data the suite builds (K between 10 and 50, thousands of calibration rows), and
Dir-ODIR is at least as good as VS there (within 0.01 NLL)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.neural_network import MLPClassifier

from cord_ops.calibrators import ConvergenceWarning, make_calibrator
from cord_ops.metrics import nll


@pytest.fixture(scope="module")
def mlp_outputs():
    """predict_proba of a confident MLP, K = 26 (the size of a letter-recognition task),
    on a 2,000-row calibration and a 2,000-row evaluation half."""
    x, y = make_classification(n_samples=6000, n_features=20, n_informative=16,
                               n_redundant=2, n_classes=26, n_clusters_per_class=1,
                               class_sep=3.0, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # the MLP's own iteration cap
        clf = MLPClassifier((64,), max_iter=200, alpha=1e-6, random_state=0)
        clf.fit(x[:2000], y[:2000])
    p = clf.predict_proba(x[2000:])
    p /= p.sum(axis=1, keepdims=True)
    return p[:2000], y[2000:4000], p[2000:], y[4000:]


@pytest.mark.slow
def test_ms_and_dir_odir_converge_and_dir_odir_matches_vs(mlp_outputs):
    pc, yc, pe, ye = mlp_outputs
    assert 0.85 < np.mean(pe.argmax(axis=1) == ye) < 0.995  # a confident, good classifier
    fitted = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)  # any capped fit fails the test
        for name in ("vs", "ms", "dir-odir"):
            fitted[name] = make_calibrator(name, input_kind="probs").fit(pc, yc)
    for cal in fitted.values():
        assert cal.converged_ and cal.warnings_ == []
    nlls = {name: nll(cal.predict_proba(pe), ye) for name, cal in fitted.items()}
    assert nlls["dir-odir"] <= nlls["vs"] + 0.01, nlls
