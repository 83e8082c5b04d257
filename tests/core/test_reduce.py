"""cord_ops.reduce on partitions held in this process: exact sums, CORD's eta* the same to
the last bit however the rows are split, the gathered mode equal to CORD.fit, calibrators
and metrics equal to their in-memory versions within the optimiser's tolerance."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from core.test_cord import output_pairs, pairs
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from cord_ops import CORD, metrics
from cord_ops.calibrators import make_calibrator
from cord_ops.partition_sums import (
    cord_partition_pass,
    cord_pass_sums,
    exact_mean,
    exact_sum,
    metric_sums,
    repaired_metric_sums,
)
from cord_ops.reduce import (
    fit_calibrator_from_sums,
    fit_cord_from_sums,
    fit_temperature,
    local_reduce,
    metrics_from_sums,
    temperature_step,
)
from cord_ops.softmax import softmax


def split(n, cuts):
    edges = [0, *sorted(set(cuts)), n]
    return [slice(lo, hi) for lo, hi in zip(edges[:-1], edges[1:], strict=True) if hi > lo]


finite = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(arrays(np.float64, st.integers(0, 80), elements=finite), st.data())
def test_exact_sum_is_the_exact_sum_for_any_split(x, data):
    exact = sum((Fraction(v) for v in x.tolist()), Fraction(0)) * 2**1074
    assert exact.denominator == 1 and exact_sum(x) == exact.numerator
    cuts = data.draw(st.lists(st.integers(0, x.shape[0]), max_size=5))
    assert sum(exact_sum(x[s]) for s in split(x.shape[0], cuts)) == exact.numerator
    if x.shape[0]:
        assert exact_mean(exact.numerator, x.shape[0]) == float(exact / 2**1074 / x.shape[0])


def scalar_partitions(p0, q, slices, lam=0.5):
    from cord_ops.cord_kernels import row_scalars

    out = []
    for rows in slices:
        b, lower, g = row_scalars(p0[rows], q[rows], lam)
        out.append({"b": b, "lower": lower, "g": g})
    return out


@settings(max_examples=150, deadline=None)
@given(output_pairs(max_n=60, max_k=30), st.lists(st.integers(1, 59), max_size=6),
       st.sampled_from(["inherited", "none", "local", "pointwise"]),
       st.sampled_from([0.0, 0.5, 1.0]))
def test_eta_does_not_depend_on_the_split(pair, cuts, target, lam):
    p0, q = pair
    n, k = p0.shape
    whole = fit_cord_from_sums(local_reduce(scalar_partitions(p0, q, [slice(0, n)], lam)), n,
                               k, CORD(mean_target=target, local_weight=lam))
    parts = scalar_partitions(p0, q, split(n, [c for c in cuts if c < n]), lam)
    reduced = fit_cord_from_sums(local_reduce(parts), n, k,
                                 CORD(mean_target=target, local_weight=lam))
    assert reduced.eta_.hex() == whole.eta_.hex()
    assert reduced.mu_.hex() == whole.mu_.hex()
    gathered = fit_cord_from_sums(local_reduce(parts), n, k,
                                  CORD(mean_target=target, local_weight=lam), gather=True)
    fitted = CORD(mean_target=target, local_weight=lam).fit(p0, q)
    assert gathered.eta_.hex() == fitted.eta_.hex()
    assert gathered.mu_.hex() == fitted.mu_.hex()


@pytest.mark.parametrize("k", [5, 50])
def test_reduced_eta_solves_the_same_equation_as_fit(k):
    """The exact-mean eta* and fit's agree to the rounding of a mean: the difference in
    the mean response they produce is a few ulps of mu."""
    p0, q = pairs(np.random.default_rng(k), 6000, k)
    parts = scalar_partitions(p0, q, split(6000, [1000, 2500, 2501, 4000]))
    reduced = fit_cord_from_sums(local_reduce(parts), 6000, k)
    fitted = CORD().fit(p0, q)
    assert fitted.eta_ != 0.0
    assert abs(reduced.mu_ - fitted.mu_) <= 4 * np.spacing(fitted.mu_)
    from cord_ops.cord_kernels import RepairTerms, response, row_scalars

    b, lower, g = row_scalars(p0, q, 0.5)
    terms = RepairTerms(None, b, None, None, lower, np.full(6000, 1 - 1e-12), g)
    for eta in (reduced.eta_, fitted.eta_):
        assert abs(np.mean(response(eta, terms)) - fitted.mu_) <= 16 * np.spacing(fitted.mu_)


def logit_data(rng, n, k):
    z = rng.normal(size=(n, k)) * 3.0
    y = (softmax(0.4 * z + rng.normal(size=k)).cumsum(axis=1) > rng.random((n, 1))).argmax(1)
    return z, y


@pytest.mark.parametrize("name", ["ts", "vs"])
def test_calibrators_reach_the_in_memory_optimum(name):
    z, y = logit_data(np.random.default_rng(7), 8000, 8)
    ref = make_calibrator(name).fit(z, y)
    parts = [{"scores": z[s], "labels": y[s]} for s in split(8000, [100, 3000, 7000])]
    cal = fit_calibrator_from_sums(name, local_reduce(parts), 8000, 8)
    nll, nll_ref = metrics.nll(cal.predict_proba(z), y), metrics.nll(ref.predict_proba(z), y)
    assert abs(nll - nll_ref) <= 1e-9 * nll_ref
    if name == "ts":
        assert abs(cal.beta_ - ref.beta_) <= 1e-10 * ref.beta_
        # exact sums: the split does not change a bit of beta
        other = fit_calibrator_from_sums("ts", local_reduce([{"scores": z, "labels": y}]), 8000, 8)
        assert other.beta_.hex() == cal.beta_.hex()
    else:
        np.testing.assert_allclose(cal.weights_, ref.weights_, atol=1e-4)
        # the bias is defined up to a common shift (softmax ignores it)
        np.testing.assert_allclose(cal.bias_ - cal.bias_.mean(), ref.bias_ - ref.bias_.mean(),
                                   atol=1e-4)


def test_other_calibrators_are_refused_naming_the_ones_that_can():
    with pytest.raises(ValueError, match=r"'isotonic'.*expected one of ts, vs"):
        fit_calibrator_from_sums("isotonic", local_reduce([]), 1, 2)


def test_metric_sums_match_the_metrics():
    rng = np.random.default_rng(3)
    p0, q = pairs(rng, 5000, 6)
    y = rng.integers(0, 6, size=5000)
    slices = split(5000, [10, 2000, 4999])
    sums = [metric_sums({"labels": y[s], "q": q[s], "p0": p0[s]}, "q", "p0") for s in slices]
    got = metrics_from_sums(sums)
    assert got["n"] == 5000
    assert got["ece"] == pytest.approx(metrics.ece(q, y), abs=1e-14)
    assert got["nll"] == pytest.approx(metrics.nll(q, y), rel=1e-14)
    assert got["brier"] == pytest.approx(metrics.brier(q, y), rel=1e-14)
    assert got["accuracy"] == metrics.accuracy(q, y)
    assert got["tpcr"] == metrics.tpcr(p0, q)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([0.3, 0.9, 1.1, 3.0]),
       st.lists(st.integers(1, 2999), max_size=4))
def test_warm_started_temperature_reaches_the_in_memory_beta(seed, off, cuts):
    """Halley from a start up to 3x off the optimum: the in-memory beta to its tolerance,
    and (exact sums) the same bits for any split of the rows."""
    z, y = logit_data(np.random.default_rng(seed), 3000, 7)
    ref = make_calibrator("ts").fit(z, y).beta_
    parts = [{"scores": z[s], "labels": y[s]} for s in split(3000, cuts)]
    params, _ = fit_temperature(local_reduce(parts), 3000, start=off * ref)
    assert abs(params["beta"] - ref) <= 1e-10 * ref
    whole, _ = fit_temperature(local_reduce([{"scores": z, "labels": y}]), 3000,
                               start=off * ref)
    assert whole["beta"].hex() == params["beta"].hex()


def test_a_settled_beta_is_confirmed_or_refused_by_the_cord_pass():
    """settle stops one pass early; the CORD pass's sums confirm a settled beta (step at
    float64 resolution) and refuse one 1e-7 off."""
    z, y = logit_data(np.random.default_rng(5), 4000, 9)
    sample = (z[:500], y[:500])
    cal = fit_calibrator_from_sums("ts", local_reduce([{"scores": z, "labels": y}]), 4000, 9,
                         sample=sample, settle=1e-5)
    ref = make_calibrator("ts").fit(z, y)
    assert abs(cal.beta_ - ref.beta_) <= 1e-10 * ref.beta_

    def step(beta):
        state = {**cal.to_dict(), "params": {"beta": beta}}
        rows = cord_partition_pass({"scores": z, "labels": y}, state, "logits", 0.5, 0,
                                   temperature=True)
        rows["labels"] = y
        return temperature_step(beta, cord_pass_sums(rows)["temperature"], 4000)

    assert step(cal.beta_) <= 1e-12
    assert step(cal.beta_ * (1 + 1e-7)) > 1e-12


@pytest.mark.parametrize("k", [6, 60])
def test_metrics_from_the_cord_pass_equal_those_of_the_repaired_arrays(k):
    """The original, calibrated and repaired outputs' metric sums from CORD's pass
    (per-row scalars, no repaired K-vector) equal metric_sums of the arrays: counts and
    TPCR exactly, NLL / ECE / Brier to rounding."""
    rng = np.random.default_rng(k)
    z, y = logit_data(rng, 3000, k)
    cal = make_calibrator("vs").fit(z[:1000], y[:1000])
    p0, q = softmax(z), cal.predict_proba(z)
    cord = CORD().fit(p0, q)
    assert cord.eta_ != 0.0
    blocks = [cord_partition_pass({"scores": z[s], "labels": y[s]}, cal.to_dict(), "logits",
                                  0.5, s.start, metrics=True) for s in split(3000, [7, 1500])]
    rows = {key: np.concatenate([b[key] for b in blocks]) for key in blocks[0]}
    rows["labels"] = y
    sums = cord_pass_sums(rows)
    got = {name: metrics_from_sums([sums[name]]) for name in ("original", "calibrated")}
    got["repaired"] = metrics_from_sums([repaired_metric_sums(rows, cord.eta_)])
    view = {"labels": y, "original": p0, "calibrated": q,
            "repaired": cord.transform(p0, q)}
    for name in ("original", "calibrated", "repaired"):
        want = metrics_from_sums([metric_sums(view, name, None if name == "original"
                                              else "original")])
        for key in ("n", "accuracy", "tpcr", "changes"):
            assert got[name].get(key) == want.get(key), (name, key)
        for key in ("nll", "brier", "ece"):
            assert got[name][key] == pytest.approx(want[key], rel=1e-13, abs=1e-15), (name, key)


@settings(max_examples=60, deadline=None)
@given(output_pairs(max_n=300, max_k=12), st.sampled_from(["inherited", "local", "pointwise"]))
def test_screened_bisection_steps_take_the_exact_branches(pair, target):
    """The reduced bisection decides far-from-root steps on estimated sums; every decision
    must be the exact mean's: eta* equals the all-exact bisection's bit for bit."""
    from cord_ops.cord_kernels import EPS_NUM
    from cord_ops.cord_solve import bisect_multiplier
    from cord_ops.reduce import _ReducedMean

    p0, q = pair
    n, k = p0.shape
    parts = scalar_partitions(p0, q, split(n, [n // 3, n // 2]))
    reduce = local_reduce(parts)
    screened = fit_cord_from_sums(reduce, n, k, CORD(mean_target=target))
    exact = _ReducedMean(reduce, n)
    exact.screening = False
    g = np.concatenate([p["g"] for p in parts])
    lower = np.concatenate([p["lower"] for p in parts])
    from cord_ops.cord_kernels import multiplier_of

    eta = bisect_multiplier(exact, screened.mu_,
                            lambda: float(multiplier_of(g, np.full(n, 1 - EPS_NUM)).max()),
                            lambda: float(multiplier_of(g, lower).min()))
    assert eta.hex() == screened.eta_.hex()


def test_vs_warm_start_refined_on_a_larger_sample(monkeypatch):
    """A sample larger than START_ROWS: VS fitted on its first rows, refined on all of it,
    then full-data steps: the in-memory optimum to the optimiser's tolerance."""
    import cord_ops.reduce as reduce_module

    monkeypatch.setattr(reduce_module, "START_ROWS", 400)
    z, y = logit_data(np.random.default_rng(9), 6000, 6)
    ref = make_calibrator("vs").fit(z, y)
    parts = [{"scores": z[s], "labels": y[s]} for s in split(6000, [2000, 4000])]
    cal = fit_calibrator_from_sums("vs", local_reduce(parts), 6000, 6, sample=(z[:1500], y[:1500]))
    np.testing.assert_allclose(cal.weights_, ref.weights_, atol=1e-4)
    assert abs(metrics.nll(cal.predict_proba(z), y) - metrics.nll(ref.predict_proba(z), y)) \
        <= 1e-9 * metrics.nll(ref.predict_proba(z), y)


def _identity_ts_state(k, input_kind="logits"):
    """A TS calibrator's state at beta = 1: q = softmax(z), so the tiny tails of the
    original rows reach q unchanged."""
    z, y = logit_data(np.random.default_rng(0), 50, k)
    return {**make_calibrator("ts", input_kind=input_kind).fit(z, y).to_dict(),
            "params": {"beta": 1.0}}


def _pass_rows(z, y, state, slices):
    blocks = [cord_partition_pass({"scores": z[s], "labels": y[s]}, state, "logits", 0.5,
                                  s.start, metrics=True) for s in slices]
    rows = {key: np.concatenate([b[key] for b in blocks]) for key in blocks[0]}
    rows["labels"] = y
    return blocks, rows


def _tiny_tail_logits(rng, n, k, gaps):
    """Ordinary logit rows, then one row per gap whose top-1 leads every other class by
    at least ``gap`` nats: a tail mass of about exp(-gap)."""
    z, y = logit_data(rng, n, k)
    extreme = -np.asarray(gaps, dtype=np.float64)[:, None] - rng.random((len(gaps), k)) * 3.0
    top = rng.integers(0, k, size=len(gaps))
    extreme[np.arange(len(gaps)), top] = 0.0
    labels = np.where(np.arange(len(gaps)) % 2 == 0, top, (top + 1) % k)
    return np.vstack([z, extreme]), np.concatenate([y, labels])


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(3, 9),
       st.lists(st.floats(345.0, 705.0), min_size=1, max_size=4),
       st.floats(-8.0, 2.0))
def test_repaired_metrics_stay_exact_for_tails_below_2_to_the_minus_500(seed, k, gaps, eta):
    """Rows whose tail mass is below ~2^-500 (all normal doubles here): the repaired tail's
    sum of squares, ((1 - s) / tail)^2 times that of the tail, must not overflow to inf
    (inf or 0 * inf = NaN make exact_sum refuse the rows) nor lose digits to a
    subnormal sum of squares. Expected: the single-machine repair's own metrics at the
    same eta (cord.transform, then cord_ops.metrics)."""
    from cord_ops.cord import set_fitted

    rng = np.random.default_rng(seed)
    z, y = _tiny_tail_logits(rng, 30, k, gaps)
    n = z.shape[0]
    _, rows = _pass_rows(z, y, _identity_ts_state(k), split(n, [11, n - 1]))
    assert np.all(rows["tail"][30:] < 2.0**-490)
    got = metrics_from_sums([repaired_metric_sums(rows, eta)])
    cord = set_fitted(CORD(), eta, 0.5, n, k)
    repaired = cord.transform(softmax(z), softmax(z))
    assert np.isfinite(got["brier"]) and np.isfinite(got["nll"])
    assert got["brier"] == pytest.approx(metrics.brier(repaired, y), rel=1e-13)
    assert got["nll"] == pytest.approx(metrics.nll(repaired, y), rel=1e-13)
    assert got["ece"] == pytest.approx(metrics.ece(repaired, y), rel=1e-12, abs=1e-15)
    assert got["accuracy"] == metrics.accuracy(repaired, y)


@pytest.mark.parametrize("eta", [-6.0, -3.0, -1.5])
def test_repaired_metrics_of_tails_a_few_subnormal_units_wide(eta):
    """Tails of ~1e-322 (tens of units of the subnormal grid) with the label in the tail:
    the label's repaired entry is (1 - s) rest_y / tail. Dividing rest_y by tail / (1 - s)
    rounds that quotient to the grid, which moves the NLL visibly at eta = -6; expected:
    the single-machine transform's metrics."""
    from cord_ops.cord import set_fitted

    k = 4
    rng = np.random.default_rng(3)
    z, y = _tiny_tail_logits(rng, 20, k, [739.0, 739.5, 740.0, 740.0])
    y[20:] = (np.argmax(z[20:], axis=1) + 1) % k  # every extreme row's label in its tail
    n = z.shape[0]
    _, rows = _pass_rows(z, y, _identity_ts_state(k), split(n, [7, n - 2]))
    assert np.all((rows["tail"][20:] > 0.0) & (rows["tail"][20:] < 1e-320))
    got = metrics_from_sums([repaired_metric_sums(rows, eta)])
    cord = set_fitted(CORD(), eta, 0.5, n, k)
    repaired = cord.transform(softmax(z), softmax(z))
    assert got["nll"] == pytest.approx(metrics.nll(repaired, y), rel=1e-13)
    assert got["brier"] == pytest.approx(metrics.brier(repaired, y), rel=1e-13)


def test_reduced_cord_fit_and_metrics_of_a_shard_with_tiny_and_subnormal_tails():
    """The brief's rows through the public path: a probability row [1 - 1e-160, 1e-160, ..]
    (as logits: log of it), a tail of 2^-600 and a subnormal tail (~1e-313), in separate
    partitions. eta* from exact sums (fit_cord_from_sums), then the repaired Brier from the
    pass: the single-machine numbers (CORD.fit's eta* to the rounding of a mean, the
    metrics of cord.transform at the reduced eta*). The tiny-tail rows are correct-label
    top-1 rows: their Brier is (1 - s)^2 (1 + |alpha|^2) with s = 1 - 1e-12 (eta* > -1 and
    b rounds to 1), about 2e-24, so the score is that of the ordinary rows alone."""
    rng = np.random.default_rng(11)
    k = 5
    z, y = logit_data(rng, 400, k)
    p = np.full((3, k), 1e-160 / (k - 1))
    p[:, 0] = 1.0
    tiny = np.log(p)
    tiny[1, 1:] = -600.0 * np.log(2.0) + np.log(1.0 / (k - 1))
    tiny[2, 1:] = -720.0
    z, y = np.vstack([z, tiny]), np.concatenate([y, [0, 0, 0]])
    n = z.shape[0]
    state = _identity_ts_state(k)
    blocks, rows = _pass_rows(z, y, state, split(n, [200, 401, 402]))
    assert rows["tail"][400] == pytest.approx(1e-160, rel=1e-12)
    assert 0.0 < rows["tail"][402] < np.finfo(np.float64).tiny
    fitted = fit_cord_from_sums(local_reduce(blocks), n, k)
    single = CORD().fit(softmax(z), softmax(z))
    assert abs(fitted.mu_ - single.mu_) <= 4 * np.spacing(single.mu_)
    assert fitted.eta_ > -1.0
    got = metrics_from_sums([repaired_metric_sums(b, fitted.eta_) for b in
                             [{**blk, "labels": y[s]} for blk, s in
                              zip(blocks, split(n, [200, 401, 402]), strict=True)]])
    repaired = fitted.transform(softmax(z), softmax(z))
    assert np.all(repaired[400:, 0] == 1.0 - 1e-12)
    assert got["brier"] == pytest.approx(metrics.brier(repaired, y), rel=1e-13)
    # the three rows' share of the score is below 1e-20 of it: the ordinary rows alone
    assert got["brier"] * n == pytest.approx(metrics.brier(repaired[:400], y[:400]) * 400,
                                             rel=1e-13)
    assert got["nll"] == pytest.approx(metrics.nll(repaired, y), rel=1e-13)
