"""Do no harm where a fit meets the reported metric: one log floor for every calibrator and
the NLL, the flow's check of a fit against the identity map on its own calibration split,
and the summary's mark on a report worse than the uncalibrated classifier."""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

from cord_ops import CORD, data, metrics
from cord_ops.calibrators import CALIBRATORS, make_calibrator
from flows.cli.summary import summary_table
from flows.recalibrate.compute import no_harm_warning

EPS64 = 2.220446049250313e-16  # float64 machine epsilon, written out


def zeros_file(seed: int = 0) -> data.Dataset:
    """An underconfident 20-class probability file with 75 % exact zeros and 1.35 % of
    rows zero on their label, as the issue's out-of-fold text classifier wrote."""
    rng = np.random.default_rng(seed)
    n, k = 6000, 20
    y = rng.integers(0, k, n)
    z = rng.normal(0.0, 1.0, (n, k))
    z[np.arange(n), y] += 3.0
    p = np.exp(z / 2.5)
    p /= p.sum(axis=1, keepdims=True)
    p = np.where(p < np.quantile(p, 0.74, axis=1, keepdims=True), 0.0, p)
    return data.Dataset(p / p.sum(axis=1, keepdims=True), y, "probs", None, "-")


@pytest.mark.parametrize("name", sorted(CALIBRATORS))
def test_one_floor_for_every_fit_and_the_reported_nll(name):
    assert make_calibrator(name).prob_floor == EPS64
    # A zero on the label costs the metric what it costs the fit at the identity map.
    assert metrics.nll(np.array([[1.0, 0.0]]), np.array([1])) == pytest.approx(
        -math.log(EPS64), rel=1e-15)


def test_ts_on_exact_zeros_fits_the_reported_nll_and_a_loser_is_said():
    cal = zeros_file()
    assert (cal.scores == 0).mean() > 0.7
    identity = metrics.nll(cal.scores, cal.labels)
    assert identity == pytest.approx(1.5929, abs=1e-4)
    ts = make_calibrator("ts", input_kind="probs").fit(cal.scores, cal.labels)
    repair = CORD().fit(cal.scores, ts.predict_proba(cal.scores))
    # Before: 1.659 (beta 0.07, the fit priced each zero at 87 nats, the report at 36);
    # with the shared floor and the bounded refit, the reported NLL's own minimum.
    assert metrics.nll(ts.predict_proba(cal.scores), cal.labels) < 0.9
    assert no_harm_warning(cal, ts, repair) is None

    # A map that loses on this split (fitted to the labels shuffled: a degenerate,
    # near-uniform optimum) is said, with both numbers.
    shuffled = np.random.default_rng(1).permutation(cal.labels)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loser = make_calibrator("ts", input_kind="probs").fit(cal.scores, shuffled)
    worse = metrics.nll(loser.predict_proba(cal.scores), cal.labels)
    assert worse > identity + 0.5
    text = no_harm_warning(cal, loser,
                           CORD().fit(cal.scores, loser.predict_proba(cal.scores)))
    assert text.startswith(f"DoNoHarmWarning: ts raises the NLL on its own calibration split "
                           f"from {identity:.6g} (uncalibrated) to {worse:.6g} (")


def _result(base_nll, cord_nll, uncal_nll=0.19):
    row = {"ece": 0.02, "brier": 0.1, "accuracy": 0.9, "tpcr": 0.0}
    return SimpleNamespace(reports={"uncal": {**row, "nll": uncal_nll},
                                    "base": {**row, "nll": base_nll},
                                    "cord": {**row, "nll": cord_nll}}, eta_star=0.5)


def test_summary_marks_the_reports_worse_than_uncalibrated():
    lines = summary_table(_result(1.236, 0.397)).splitlines()  # the issue's `ms` run
    marked = [line.split()[0] for line in lines if "! NLL worse than uncal" in line]
    assert marked == ["base", "cord"]
    lines = summary_table(_result(0.18, 0.1900001)).splitlines()  # within 1e-6: a tie
    assert not any("worse than uncal" in line for line in lines)
