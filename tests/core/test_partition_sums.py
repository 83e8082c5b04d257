"""cord_ops.partition_sums' reducers one function at a time: exact sums, per-row metric
sums, the TS and VS sums, and CORD's pass and repair. Expectations are written out,
computed here with numpy / fractions, or taken from the single-machine path
(cord_kernels.sweep, CORD.transform, cord_ops.metrics).
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
from core.sums_reference import (
    SCALE,
    fraction_sum,
    logit_rows,
    metrics_from,
    part_scalars,
    response_terms,
    units,
    vs_reference,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from cord_ops import CORD, metrics
from cord_ops.calibrators import make_calibrator
from cord_ops.cord_kernels import sweep
from cord_ops.metrics import PROB_FLOOR
from cord_ops.partition_sums import (
    STEP_ROWS,
    _logits,
    _row_metric_sums,
    cord_multiplier_range,
    cord_partition_pass,
    cord_response_estimate,
    cord_response_sum,
    cord_row_scalars,
    cord_sums,
    exact_mean,
    exact_sum,
    metric_sums,
    partition_label_counts,
    repaired_metric_sums,
    ts_moment_sums,
    vs_newton_sums,
    vs_value_grad_sums,
)
from cord_ops.softmax import softmax

# ---------------------------------------------------------------- partition_sums.exact_sum


def test_exact_sum_of_nothing_and_of_zeros_is_zero():
    assert exact_sum(np.array([])) == 0
    assert exact_sum(np.zeros(7)) == 0
    assert exact_sum(np.array([0.0, -0.0])) == 0


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_exact_sum_refuses_non_finite_values_in_one_line(bad):
    with pytest.raises(ValueError, match=r"^exact_sum: expected finite values$"):
        exact_sum(np.array([1.0, bad, 2.0]))


def test_exact_sum_of_values_near_the_float_range_uses_fractions():
    x = np.array([2.0**1000, -2.0**1000, 1.5 * 2.0**960, 2.0**-1074, -3.0])
    assert exact_sum(x) == fraction_sum(x)
    assert exact_sum(np.array([2.0**960])) == 2**(960 + 1074)
    assert exact_sum(np.array([np.finfo(np.float64).max])) == fraction_sum(
        [np.finfo(np.float64).max])


def test_exact_sum_of_values_spread_over_every_exponent():
    x = np.array([1.0, 2.0**-1074, 2.0**-600, -2.0**-1073, 3.0 * 2.0**-1000, 2.0**959,
                  -(2.0**-40), 0.1, np.finfo(np.float64).tiny, 5e-324 * 7])
    assert exact_sum(x) == fraction_sum(x)
    assert exact_sum(np.array([2.0**-1074])) == 1
    assert exact_sum(np.array([-(2.0**-1074), 2.0**-1073])) == 1
    assert exact_sum(np.array([0.75, 2.0**-1074])) == 3 * 2**1072 + 1


def test_exact_sum_of_float32_and_lists_reads_them_as_float64():
    assert exact_sum(np.array([0.1, 0.2], dtype=np.float32)) == fraction_sum(
        np.array([0.1, 0.2], dtype=np.float32).astype(np.float64))
    assert exact_sum([[0.5, 0.25], [1.0, 2.0**-1074]]) == units(1.75) + 1


def test_exact_sum_adds_chunks_of_two_to_the_21_values_exactly():
    """More values than one chunk holds, with the chunk's largest value only in the second
    chunk and a last unit beyond it: every chunk is summed, at its own scale."""
    n = (1 << 21) + 3
    x = np.full(n, 2.0**-30)
    x[-2] = 2.0**20
    x[-1] = 2.0**-1074
    assert exact_sum(x) == (n - 2) * 2**(1074 - 30) + 2**(1074 + 20) + 1
    x = np.zeros(n)
    x[0] = 1.0
    x[-1] = 3.0
    assert exact_sum(x) == 4 * SCALE


def test_exact_sum_of_a_zero_chunk_then_others_and_of_huge_then_normal_chunks(monkeypatch):
    """Chunks of 4 values (the chunk size patched down from 2^21 so the huge values'
    Fraction path stays cheap): a zero chunk is skipped, not the end; a huge chunk's sum
    adds to the others'."""
    import cord_ops.partition_sums as partition_sums

    monkeypatch.setattr(partition_sums, "_CHUNK", 4)
    x = np.zeros(10)
    x[-1] = 3.0
    assert exact_sum(x) == 3 * SCALE
    x[0] = 2.0**1000
    assert exact_sum(x) == 2**2074 + 3 * SCALE
    x[0], x[-1] = 1.0, 2.0**1000
    assert exact_sum(x) == SCALE + 2**2074


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=64), max_size=12),
       st.integers(-1074, 1000))
def test_exact_sum_is_exact_at_any_scale(values, exponent):
    x = np.array(values + [math.ldexp(1.0, exponent), -math.ldexp(3.0, exponent - 1)])
    assert exact_sum(x) == fraction_sum(x)


def test_exact_mean_rounds_correctly():
    assert exact_mean(units(1.0) + units(2.0), 3) == 1.0
    assert exact_mean(1, 1) == 5e-324
    assert exact_mean(units(1.0), 3) == float(Fraction(1, 3))
    assert exact_mean(units(-7.0), 2) == -3.5


# ------------------------------------------------------------------- partition_sums misc


def test_logits_of_probabilities_are_floored_logs_and_logits_pass_as_float64():
    p = np.array([[0.0, 0.25, 0.75], [1e-30, 0.5, 0.5]], dtype=np.float32)
    got = _logits(p, "probs", 1e-4)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, np.log(np.maximum(p.astype(np.float64), 1e-4)))
    z = np.array([[-3.0, 0.5, 2.0]], dtype=np.float32)
    got = _logits(z, "logits", 1e-4)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, z.astype(np.float64))


def test_label_counts_have_a_zero_for_every_absent_class():
    got = partition_label_counts({"labels": np.array([0, 2, 2, 4])}, 6)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, [1, 0, 2, 0, 1, 0])
    np.testing.assert_array_equal(partition_label_counts({"labels": np.array([], int)}, 2), [0, 0])




def test_cord_sums_range_and_scalars_of_a_partition():
    part = part_scalars(1, 40, 5)
    b, lower, g = part["b"], part["lower"], part["g"]
    assert cord_sums(part) == (fraction_sum(b), fraction_sum(lower), fraction_sum(g),
                               fraction_sum(np.clip(b, lower, 1.0 - 1e-12)))
    up = 1.0 - 1e-12
    assert cord_multiplier_range(part) == (float(np.max((up - g) / (up * (1.0 - up)))),
                                           float(np.min((lower - g) / (lower * (1.0 - lower)))))
    got = cord_row_scalars(part)
    assert got[0] is b and got[1] is lower and got[2] is g


def test_cord_pointwise_sum_clips_b_into_the_interval():
    part = {"b": np.array([0.1, 0.5, 1.0]), "lower": np.array([0.3, 0.2, 0.4]),
            "g": np.array([0.2, 0.2, 0.2])}
    assert cord_sums(part)[3] == fraction_sum([0.3, 0.5, 1.0 - 1e-12])




def test_response_sum_and_estimate_over_more_rows_than_a_step_chunk():
    n = STEP_ROWS + 777
    part = part_scalars(2, n, 4)
    for eta in (-3.0, 0.0, 1.0, 2.5, 40.0):
        psi = response_terms(eta, part)
        # fsum is the correctly rounded sum, as exact_mean of the exact sum over 1 is
        assert exact_mean(cord_response_sum(part, eta), 1) == math.fsum(psi)
        # the sqrt form and pairwise sums: the same sum to a few ulps per row
        assert cord_response_estimate(part, eta) == pytest.approx(math.fsum(psi), rel=1e-14)
    tail = {key: value[-5:] for key, value in part.items()}
    assert cord_response_sum(tail, 0.5) == fraction_sum(response_terms(0.5, tail))


def test_response_estimate_above_eta_one_avoids_the_cancelling_form():
    """eta = 1000, g = 1e-8: H ~ 1 - 1/eta, where 2g / ((1 - eta) + R) would cancel to
    ~1e-5 relative; the form for eta > 1 is within a few ulps."""
    part = {"g": np.full(4, 1e-10), "lower": np.full(4, 1e-11)}
    for eta in (1000.0, 1.5):
        assert cord_response_estimate(part, eta) == pytest.approx(
            math.fsum(response_terms(eta, part)), rel=1e-14)
    # g = 1 - 1e-11 at eta = 100: H is above 1 - 1e-12, clipped there in both sums
    near_one = {"g": np.full(3, 1.0 - 1e-11), "lower": np.full(3, 0.5)}
    assert cord_response_estimate(near_one, 100.0) == math.fsum([1.0 - 1e-12] * 3)
    assert cord_response_sum(near_one, 100.0) == 3 * units(1.0 - 1e-12)


def test_response_estimate_clips_both_ends_of_the_interval():
    part = {"g": np.array([0.2, 0.9, 0.999999]), "lower": np.array([0.5, 0.3, 0.3])}
    # eta = -5: H(0.2) is far below 0.5 (clipped up); eta = 100: H(0.999999) ~ 1, clipped
    # to 1 - 1e-12
    for eta in (-5.0, 100.0):
        expected = float(np.sum(response_terms(eta, part)))
        assert cord_response_estimate(part, eta) == pytest.approx(expected,
                                                                  rel=1e-15)
    assert cord_response_estimate(part, 100.0) <= 2.0 + (1.0 - 1e-12)


# ------------------------------------------------------------ partition_sums._row_metric_sums


def test_row_metric_sums_bins_are_half_open_from_the_left():
    """(l, u] bins: a confidence exactly on edge i (i / 15) counts in bin i - 1, 0 in bin
    0, 1 in the last; nll clips the label's probability to [eps, 1 - eps]; brier is
    sum_sq - 2 p_y + 1; accuracy counts per bin."""
    conf = np.linspace(0.0, 1.0, 16)
    correct = np.arange(16) % 2 == 0
    on_label = np.concatenate([[0.0, 1.0], conf[2:]])
    sum_sq = np.full(16, 0.5)
    got = _row_metric_sums(conf, correct, on_label, sum_sq, 15)
    assert got["n"] == 16
    assert got["counts"].dtype == np.int64 and got["acc"].dtype == np.int64
    np.testing.assert_array_equal(got["counts"], [2] + [1] * 14)
    # rows 0 and 1 (bin 0): correct, not; then row i in bin i - 1, correct for even i
    np.testing.assert_array_equal(got["acc"], [1] + [j % 2 for j in range(1, 15)])
    assert got["conf"] == [fraction_sum(conf[:2])] + [fraction_sum(conf[i + 1:i + 2])
                                                      for i in range(1, 15)]
    true_mass = np.concatenate([[PROB_FLOOR, 1.0 - PROB_FLOOR], conf[2:15], [1.0 - PROB_FLOOR]])
    assert got["nll"] == exact_sum(-np.log(true_mass))
    assert got["brier"] == fraction_sum(0.5 - 2.0 * on_label + 1.0)


def test_row_metric_sums_with_other_bin_counts():
    conf = np.array([0.05, 0.25, 0.2500000000000001, 0.5, 0.99])
    got = _row_metric_sums(conf, np.ones(5, bool), conf, conf * conf, 4)
    np.testing.assert_array_equal(got["counts"], [2, 2, 0, 1])
    np.testing.assert_array_equal(got["acc"], [2, 2, 0, 1])
    assert got["conf"] == [fraction_sum(conf[:2]), fraction_sum(conf[2:4]), 0,
                           fraction_sum(conf[4:])]


def test_a_confidence_rounded_above_one_counts_in_the_top_bin():
    conf = np.array([1.0, math.nextafter(1.0, 2.0), 0.5])
    got = _row_metric_sums(conf, np.ones(3, bool), np.full(3, 0.5), np.full(3, 0.5), 4)
    np.testing.assert_array_equal(got["counts"], [0, 1, 0, 2])
    assert len(got["conf"]) == 4 and got["conf"][3] == fraction_sum(conf[:2])


def test_metric_sums_count_each_kind_of_top_1_change():
    """Rows: kept correct, kept wrong, wrong -> right (+), right -> wrong (-), wrong ->
    other wrong (0)."""
    p0 = np.array([[0.7, 0.2, 0.1], [0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.8, 0.1, 0.1],
                   [0.6, 0.3, 0.1]])
    q = np.array([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.3, 0.6, 0.1], [0.2, 0.7, 0.1],
                  [0.2, 0.7, 0.1]])
    y = np.array([0, 2, 1, 0, 2])
    part = {"labels": y, "q": q, "p0": p0}
    for kwargs in ({}, {"reference_top": np.array([0, 0, 0, 0, 0])}):
        got = metric_sums(part, "q", "p0", **kwargs)
        assert (got["changed"], got["c_plus"], got["c_minus"], got["c_zero"]) == (3, 1, 1, 1)
    plain = metric_sums(part, "q")
    assert "changed" not in plain
    assert plain["brier"] == exact_sum(np.sum(q * q, axis=1) - 2.0 * q[np.arange(5), y] + 1.0)


def test_metric_sums_use_the_known_reference_top_1_and_read_float32_as_float64():
    p0 = np.array([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3]])
    q = np.array([[0.2, 0.5, 0.3], [0.1, 0.6, 0.3]], dtype=np.float32)
    y = np.array([1, 1])
    # no reference array in the partition: only the given top-1 classes are read
    got = metric_sums({"labels": y, "q": q}, "q", "p0", reference_top=np.array([0, 1]))
    assert (got["changed"], got["c_plus"], got["c_minus"], got["c_zero"]) == (1, 1, 0, 0)
    want = metric_sums({"labels": y, "q": q.astype(np.float64), "p0": p0}, "q", "p0")
    assert got == {key: want[key] for key in got if key != "counts" and key != "acc"} | {
        "counts": got["counts"], "acc": got["acc"]}
    np.testing.assert_array_equal(got["counts"], want["counts"])
    q64 = q.astype(np.float64)
    assert got["brier"] == exact_sum(np.sum(q64 * q64, 1) - 2.0 * q64[[0, 1], y] + 1.0)


def test_rows_counts_the_labels():
    from cord_ops.partition_sums import rows

    assert rows({"labels": np.zeros(7, dtype=int), "scores": np.zeros((7, 3))}) == 7
    assert type(rows({"labels": np.zeros(0, dtype=int)})) is int


# ------------------------------------------------------------- partition_sums: TS and VS sums


@pytest.mark.parametrize("beta", [0.3, 1.0, 2.5])
def test_ts_moment_sums_are_the_tempered_moments(beta):
    z, y = logit_rows(3, 50, 6)
    z[0] += 40.0  # rows with different maxima: the shift is per row
    part = {"scores": z, "labels": y}
    zs = z - z.max(axis=1, keepdims=True)
    q = softmax(beta * zs)
    m1 = np.sum(q * zs, axis=1)
    c = zs - m1[:, None]
    want = [np.sum(m1), np.sum(q * c * c), np.sum(q * c**3)]
    got = ts_moment_sums(part, beta, "logits", 1e-4)
    assert len(got) == 3
    for value, expected in zip(got, want, strict=True):
        assert float(Fraction(value, SCALE)) == pytest.approx(expected, rel=1e-10, abs=1e-10)
    with_labels = ts_moment_sums(part, beta, "logits", 1e-4, True)
    assert with_labels[:3] == got
    assert with_labels[3] == fraction_sum(zs[np.arange(50), y])


def test_ts_moment_sums_of_probabilities_take_the_floored_log():
    p = softmax(logit_rows(4, 30, 5)[0])
    p[0, 0] = 0.0
    y = np.zeros(30, dtype=int)
    got = ts_moment_sums({"scores": p, "labels": y}, 1.0, "probs", 1e-3, True)
    z = np.log(np.maximum(p, 1e-3))
    want = ts_moment_sums({"scores": z, "labels": y}, 1.0, "logits", 1e-3, True)
    assert got == want




@pytest.mark.parametrize("kind", ["logits", "probs"])
def test_vs_sums_are_the_written_out_nll_gradient_and_hessian(kind):
    z, y = logit_rows(5, 40, 4)
    scores = softmax(z) if kind == "probs" else z
    if kind == "probs":
        scores[0, 1] = 0.0
    w, b = np.array([0.9, 1.1, 0.7, 1.3]), np.array([0.1, -0.2, 0.3, 0.0])
    x = np.log(np.maximum(scores, 1e-3)) if kind == "probs" else scores
    nll, grad, h = vs_reference(x, y, w, b)
    part = {"scores": scores, "labels": y}
    got = vs_newton_sums(part, w, b, kind, 1e-3)
    assert got[0] == pytest.approx(nll, rel=1e-13)
    np.testing.assert_allclose(got[1], grad, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(got[2], h, rtol=1e-11, atol=1e-12)
    value, gradient = vs_value_grad_sums(part, w, b, kind, 1e-3)
    assert value == pytest.approx(nll, rel=1e-13)
    np.testing.assert_allclose(gradient, grad, rtol=1e-11, atol=1e-12)


# ------------------------------------------------------- partition_sums: CORD's pass and repair


@pytest.mark.parametrize("kind", ["logits", "probs"])
def test_cord_partition_pass_rows_are_the_single_machine_terms(kind):
    z, y = logit_rows(6, 200, 5)
    scores = softmax(z) if kind == "probs" else z
    cal = make_calibrator("vs", input_kind=kind).fit(scores[:100], y[:100])
    state = cal.to_dict()
    p0 = scores if kind == "probs" else softmax(z)
    q = cal.predict_proba(scores)
    terms = sweep(p0, q, 0.3, keep_rest=True)
    out = cord_partition_pass({"scores": scores, "labels": y}, state, kind, 0.3, 0,
                              metrics=True, temperature=True)
    idx, a = np.arange(200), terms.label
    np.testing.assert_array_equal(out["b"], terms.b)
    np.testing.assert_array_equal(out["lower"], terms.lower)
    np.testing.assert_array_equal(out["g"], terms.g)
    np.testing.assert_array_equal(out["tail"], terms.tail)
    np.testing.assert_array_equal(out["rest_y"], terms.rest[idx, y])
    alpha = terms.rest / terms.tail[:, None]
    np.testing.assert_allclose(out["alpha_sq"], np.sum(alpha * alpha, 1), rtol=1e-14)
    np.testing.assert_array_equal(out["hit"], a == y)
    np.testing.assert_array_equal(out["p0_top"], p0[idx, a])
    np.testing.assert_array_equal(out["p0_y"], p0[idx, y])
    np.testing.assert_allclose(out["p0_sq"], np.sum(p0 * p0, 1), rtol=1e-14)
    assert out["q_top"].dtype == np.int32
    np.testing.assert_array_equal(out["q_top"], np.argmax(q, 1))
    np.testing.assert_array_equal(out["q_conf"], q[idx, np.argmax(q, 1)])
    np.testing.assert_array_equal(out["q_y"], q[idx, y])
    np.testing.assert_allclose(out["q_sq"], np.sum(q * q, 1), rtol=1e-14)
    np.testing.assert_array_equal(out["changed"], np.argmax(q, 1) != a)
    zz = np.log(np.maximum(scores, cal.prob_floor)) if kind == "probs" else z
    mean_z = np.sum(q * zz, 1)
    np.testing.assert_allclose(out["t_slope"], mean_z - zz[idx, y], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out["t_var"], np.sum(q * zz * zz, 1) - mean_z**2, rtol=1e-10,
                               atol=1e-12)


def test_cord_partition_pass_reads_float32_scores_as_float64():
    z, y = logit_rows(30, 60, 4)
    z32 = z.astype(np.float32)
    state = make_calibrator("vs").fit(z, y).to_dict()
    got = cord_partition_pass({"scores": z32, "labels": y}, state, "logits", 0.5, 0,
                              metrics=True, temperature=True)
    want = cord_partition_pass({"scores": z32.astype(np.float64), "labels": y}, state,
                               "logits", 0.5, 0, metrics=True, temperature=True)
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_cord_partition_pass_without_options_keeps_only_the_scalars_and_names_rows():
    z, y = logit_rows(7, 20, 3)
    state = make_calibrator("ts").fit(z, y).to_dict()
    out = cord_partition_pass({"scores": z, "labels": y}, state, "logits", 0.5, 0)
    assert sorted(out) == ["b", "g", "lower"]
    bad = softmax(z)
    bad[3] = [0.5, 0.5, 0.5]
    with pytest.raises(ValueError, match=r"row 1003\b"):
        cord_partition_pass({"scores": bad, "labels": y}, state, "probs", 0.5, 1000)


def _repaired(p0, q, eta):
    from cord_ops.cord import set_fitted

    return set_fitted(CORD(), eta, 0.5, p0.shape[0], p0.shape[1]).transform(p0, q)


@pytest.mark.parametrize("eta", [-2.0, -0.4, 0.0, 0.7, 3.0])
def test_repaired_metric_sums_are_those_of_the_transformed_rows(eta):
    """Labels on and off the original top-1, rows CORD keeps (s == b) and rows it moves:
    counts and accuracy exactly, per-bin confidence, NLL and Brier to rounding."""
    z, y = logit_rows(8, 300, 5)
    y[:40] = np.argmax(z[:40], 1)  # the label on the original top-1
    cal = make_calibrator("ts").fit(z, y)
    state = {**cal.to_dict(), "params": {"beta": 0.6}}
    p0, q = softmax(z), softmax(0.6 * z)
    rows = cord_partition_pass({"scores": z, "labels": y}, state, "logits", 0.5, 0,
                               metrics=True)
    rows["labels"] = y
    got = repaired_metric_sums(rows, eta)
    rep = _repaired(p0, q, eta)
    idx = np.arange(300)
    top = np.argmax(rep, 1)
    want = _row_metric_sums(rep[idx, top], top == y, rep[idx, y], np.sum(rep * rep, 1), 15)
    np.testing.assert_array_equal(got["counts"], want["counts"])
    np.testing.assert_array_equal(got["acc"], want["acc"])
    assert got["n"] == 300
    assert (got["changed"], got["c_plus"], got["c_minus"], got["c_zero"]) == (0, 0, 0, 0)
    for key in ("nll", "brier"):
        assert float(Fraction(got[key], SCALE)) == pytest.approx(
            float(Fraction(want[key], SCALE)), rel=1e-13)
    for mine, theirs in zip(got["conf"], want["conf"], strict=True):
        assert float(Fraction(mine, SCALE)) == pytest.approx(float(Fraction(theirs, SCALE)),
                                                             rel=1e-13, abs=1e-300)
    summary = metrics_from(got)
    assert summary["nll"] == pytest.approx(metrics.nll(rep, y), rel=1e-13)
    assert summary["brier"] == pytest.approx(metrics.brier(rep, y), rel=1e-13)




def test_repaired_label_entries_of_kept_and_overflowing_rows():
    """Hand-made rows: kept (s == b: q's entry, factor 1, its own tail in the sum of
    squares: 0.3 here, not 1 - s), moved (factor (1 - s) / tail) and a subnormal tail whose
    factor overflows (the entry is rest_y / tail times 1 - s, without a warning)."""
    part = {"g": np.array([0.6, 0.3, 0.3]), "lower": np.array([0.1, 0.1, 0.1]),
            "b": np.array([0.6, 0.5, 0.5]), "tail": np.array([0.3, 0.5, 1e-320]),
            "rest_y": np.array([0.1, 0.2, 4e-321]), "hit": np.array([False, False, False]),
            "alpha_sq": np.array([0.5, 0.6, 0.7]), "labels": np.array([1, 1, 1])}
    eta = 0.0  # s = g: row 0 kept (0.6 == b), rows 1 and 2 moved to 0.3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = repaired_metric_sums(part, eta)
    on_label = np.array([0.1, 0.2 * (0.7 / 0.5), (4e-321 / 1e-320) * 0.7])
    assert got["nll"] == exact_sum(-np.log(np.clip(on_label, PROB_FLOOR, 1 - PROB_FLOOR)))
    sum_sq = np.array([0.36 + 0.3**2 * 0.5, 0.09 + 0.7**2 * 0.6, 0.09 + 0.7**2 * 0.7])
    assert got["brier"] == exact_sum(sum_sq - 2.0 * on_label + 1.0)
    np.testing.assert_array_equal(got["counts"], np.bincount([4, 8, 4], minlength=15))
    hit = {**part, "hit": np.array([True, True, True])}
    got = repaired_metric_sums(hit, eta)
    assert got["nll"] == exact_sum(-np.log(np.array([0.6, 0.3, 0.3])))
    np.testing.assert_array_equal(got["acc"], np.bincount([4, 8, 4], minlength=15))


