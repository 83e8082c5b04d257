"""CORD against the paper: an independent transcription, Proposition 1's guarantees as
hypothesis properties, constructed plateaus, boundary rows and hand-computed examples."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import load_shared, requires_shared
from core import cord_listing as listing
from core import cord_reference as ref
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from sklearn.exceptions import NotFittedError

from cord_ops import CORD, cord_kernels, cord_solve, minimal_repair, validation
from cord_ops.cord_kernels import EPS_NUM, pairwise_column_sum

TOL = 1e-9


def softmax(z):
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def pairs(rng, n, k, scale=3.0, flip_noise=0.8):
    """Original outputs and a vector-scaling-like miscalibrated q that flips some argmaxes."""
    z = rng.normal(size=(n, k)) * scale
    w = rng.uniform(0.3, 1.5, size=k)
    q_logits = z * w + rng.normal(size=k) + rng.normal(size=(n, k)) * flip_noise
    return softmax(z), softmax(q_logits)


@st.composite
def output_pairs(draw, max_n=25, max_k=6):
    """p0, q with ties, exact zeros and wide logits mixed in."""
    n = draw(st.integers(1, max_n))
    k = draw(st.integers(2, max_k))
    grid = st.sampled_from([-50.0, -3.0, -1.0, 0.0, 0.0, 1.0, 2.5, 40.0])
    cont = st.floats(-8, 8, allow_nan=False)
    logits = st.one_of(grid, cont)
    z0 = draw(arrays(np.float64, (n, k), elements=logits))
    z1 = draw(arrays(np.float64, (n, k), elements=logits))
    p0, q = softmax(z0), softmax(z1)
    zero_mask = draw(arrays(np.bool_, (n, k), elements=st.booleans()))
    if draw(st.booleans()):
        # exact zeros: drop entries and renormalise (keep at least one positive per row)
        zero_mask[:, 0] = False
        q = np.where(zero_mask, 0.0, q)
        q /= q.sum(axis=1, keepdims=True)
    return p0, q


def assert_matches_reference(model, p0, q, lam=0.5, target="inherited"):
    eta, mu = ref.fit(p0, q, lam, target)
    # A few ulps of the target mean, divided by the mean response's slope, is as close as
    # two correct binary64 solvers can agree when the active rows sit near s = 0 or 1.
    slope = ref.mean_slope(eta, p0, q, lam)
    conditioning = 8 * np.spacing(mu) / slope if slope > 0 else 0.0
    assert abs(model.eta_ - eta) <= TOL * (1.0 + abs(eta)) + conditioning
    expected = np.array(ref.transform(eta, p0, q, lam))
    np.testing.assert_allclose(model.transform(p0, q), expected, rtol=0, atol=TOL)


# --- hand-computed examples -------------------------------------------------------------

def test_single_flipped_row_by_hand():
    p0 = np.array([[0.5, 0.3, 0.2]])
    q = np.array([[0.2, 0.5, 0.3]])
    # a = 0, b = 0.2, alpha = (0, 5/8, 3/8), rho = 5/8, lower = 5/13 + eps,
    # g = (0.2 + 0.5)/2 = 0.35 < lower, so mu = lower = psi(0) and eta* = 0.
    model = CORD().fit(p0, q)
    assert model.eta_ == 0.0
    s = 5 / 13 + EPS_NUM
    expected = [[s, (1 - s) * 5 / 8, (1 - s) * 3 / 8]]
    np.testing.assert_allclose(model.transform(p0, q), expected, rtol=0, atol=1e-15)


def test_two_rows_by_hand_negative_multiplier():
    # Row 0 flips: b0 = 0.2 with lower0 = 5/13 + eps and g0 = 0.35, so it sits at lower0
    # for every eta <= h(g0, lower0) > 0. Row 1 keeps its prediction with b1 = 0.7.
    # mu = mean(b) = 0.45; the lift of row 0 is paid by row 1: s1 = 0.7 - (lower0 - 0.2).
    p0 = np.array([[0.5, 0.3, 0.2], [0.7, 0.2, 0.1]])
    q = np.array([[0.2, 0.5, 0.3], [0.7, 0.2, 0.1]])
    model = CORD().fit(p0, q)
    lower0 = 5 / 13 + EPS_NUM
    s1 = 0.7 - (lower0 - 0.2)
    eta = (s1 - 0.7) / (s1 * (1 - s1))
    assert model.eta_ == pytest.approx(eta, rel=1e-12)
    out = model.transform(p0, q)
    np.testing.assert_allclose(out[:, 0], [lower0, s1], rtol=0, atol=1e-12)
    assert out[:, 0].mean() == pytest.approx(0.45, abs=1e-15)


# --- agreement with the independent transcription ---------------------------------------

@settings(max_examples=60, deadline=None)
@given(output_pairs())
def test_matches_independent_transcription(pair):
    p0, q = pair
    assert_matches_reference(CORD().fit(p0, q), p0, q)


@pytest.mark.parametrize("target", ["inherited", "none", "local", "pointwise"])
@pytest.mark.parametrize("lam", [0.0, 0.3, 0.5, 1.0])
def test_variants_match_transcription(target, lam):
    p0, q = pairs(np.random.default_rng(7), 300, 5)
    model = CORD(mean_target=target, local_weight=lam).fit(p0, q)
    assert_matches_reference(model, p0, q, lam, target)


def test_new_inputs_use_the_fitted_multiplier():
    rng = np.random.default_rng(3)
    p0, q = pairs(rng, 400, 6)
    new_p0, new_q = pairs(rng, 50, 6)
    model = CORD().fit(p0, q)
    eta, _ = ref.fit(p0, q)
    expected = np.array(ref.transform(eta, new_p0, new_q))
    np.testing.assert_allclose(model.transform(new_p0, new_q), expected, rtol=0, atol=TOL)


# --- Proposition 1 as properties --------------------------------------------------------

@settings(max_examples=80, deadline=None)
@given(output_pairs())
def test_proposition_1(pair):
    p0, q = pair
    model = CORD().fit(p0, q)
    out = model.transform(p0, q)
    a = p0.argmax(axis=1)
    rows = np.arange(len(a))
    # 1. on the simplex
    assert (out >= 0).all()
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    # 2. the original class is the argmax and strictly on top
    assert (out.argmax(axis=1) == a).all()
    others = out.copy()
    others[rows, a] = -np.inf
    assert (out[rows, a] > others.max(axis=1)).all()
    # 4. the calibration-split mean of s equals mu
    assert abs(out[rows, a].mean() - model.mu_) <= 1e-12
    # 3. the conditional distribution over j != a is the (stabilised) q's
    edge = q.min(axis=1) <= 0
    q_int = np.where(edge[:, None], (1 - 1e-10) * q + 1e-10 / q.shape[1], q)
    mask = np.ones_like(q, dtype=bool)
    mask[rows, a] = False
    cond_out = np.where(mask, out, 0) / np.where(mask, out, 0).sum(axis=1, keepdims=True)
    cond_q = np.where(mask, q_int, 0) / np.where(mask, q_int, 0).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(cond_out, cond_q, rtol=1e-10, atol=1e-300)


@settings(max_examples=60, deadline=None)
@given(
    arrays(np.float64, st.tuples(st.integers(1, 30), st.integers(2, 7)),
           elements=st.floats(-10, 10, allow_nan=False)),
    st.floats(0.2, 5.0),
)
def test_identity_when_q_keeps_every_prediction(z, temperature):
    p0 = softmax(z)
    q = softmax(z / temperature)
    a = p0.argmax(axis=1)
    b = q[np.arange(len(a)), a]
    rest = q.copy()
    rest[np.arange(len(a)), a] = 0
    rho = rest.max(axis=1) / rest.sum(axis=1)
    inside = (b >= rho / (1 + rho) + EPS_NUM).all() and (b <= 1 - EPS_NUM).all()
    model = CORD().fit(p0, q)
    if inside:
        assert model.eta_ == 0.0
        np.testing.assert_array_equal(model.transform(p0, q), q)
    else:  # ties under TS: the repair must still lift a_i strictly on top
        assert (model.transform(p0, q).argmax(axis=1) == a).all()


def test_identity_characterisation_converse():
    # one row whose b lies outside I: the transform is not q on that row
    p0 = np.array([[0.6, 0.4], [0.9, 0.1]])
    q = np.array([[0.4, 0.6], [0.9, 0.1]])
    out = CORD().fit_transform(p0, q)
    assert not np.array_equal(out[0], q[0])
    assert out[0].argmax() == 0


# --- plateaus: the multiplier set is an interval ----------------------------------------

def test_plateau_at_lower_mean_picks_nearest_zero_end():
    # mean(b) < mean(lower), so mu = mean(lower) and E = (-inf, min_i h(g_i, lower_i)].
    # Row 1 keeps its prediction with b above its lower bound, so min h < 0 and eta*
    # is exactly that end.
    p0 = np.array([[0.5, 0.3, 0.2], [0.55, 0.25, 0.2]])
    q = np.array([[0.02, 0.9, 0.08], [0.45, 0.30, 0.25]])
    model = CORD().fit(p0, q)
    a = np.array([0, 0])
    rest = q.copy()
    rest[[0, 1], a] = 0
    rho = rest.max(axis=1) / rest.sum(axis=1)
    lower = rho / (1 + rho) + EPS_NUM
    b = q[[0, 1], a]
    assert b.mean() < lower.mean()
    g = np.array([(b[0] + p0[0, 0]) / 2, b[1]])
    h_lower = (lower - g) / (lower * (1 - lower))
    assert h_lower.min() < 0 < h_lower.max()
    assert model.eta_ == pytest.approx(h_lower.min(), rel=1e-13)
    np.testing.assert_allclose(model.transform(p0, q)[:, 0], lower, rtol=0, atol=1e-15)


def test_interior_plateau_returns_end_nearest_zero():
    # Row 0 sits at its lower bound for eta <= h0 < 0, row 1 (b above 1 - eps) at its
    # upper bound for eta >= h1; with the pointwise target the mean is flat on [h1, h0].
    p0 = np.array([[0.6, 0.3, 0.1], [0.98, 0.01, 0.01]])
    q = np.array([[0.05, 0.9, 0.05], [1 - 2e-14, 1e-14, 1e-14]])
    model = CORD(mean_target="pointwise", local_weight=0.0).fit(p0, q)
    rho0 = 0.9 / 0.95
    lower0 = rho0 / (1 + rho0) + EPS_NUM
    g0 = 0.6
    h0 = (lower0 - g0) / (lower0 * (1 - lower0))
    upper = 1 - EPS_NUM
    h1 = (upper - q[1, 0]) / (upper * (1 - upper))
    assert h1 < h0 < 0
    assert model.eta_ == pytest.approx(h0, rel=1e-12)
    assert_matches_reference(model, p0, q, lam=0.0, target="pointwise")


# --- boundary rows, ties, scale, dtype, sizes -------------------------------------------

def test_boundary_rows_are_stabilised_and_interior_rows_untouched():
    rng = np.random.default_rng(11)
    p0, q = pairs(rng, 200, 4)
    q[:20, 1:] = 0.0
    q[:20, 0] = 1.0
    p0[20:30] = [0.0, 1.0, 0.0, 0.0]
    model = CORD().fit(p0, q)
    assert_matches_reference(model, p0, q)
    out = model.transform(p0, q)
    assert np.isfinite(out).all()
    assert (out.argmax(axis=1) == p0.argmax(axis=1)).all()


def test_ties_follow_smallest_index():
    p0 = np.array([[0.4, 0.4, 0.2], [0.3, 0.35, 0.35], [0.25, 0.25, 0.5]])
    q = np.array([[0.3, 0.3, 0.4], [0.2, 0.4, 0.4], [0.5, 0.25, 0.25]])
    out = CORD().fit_transform(p0, q)
    np.testing.assert_array_equal(out.argmax(axis=1), [0, 1, 2])
    assert_matches_reference(CORD().fit(p0, q), p0, q)


def test_two_classes():
    p0, q = pairs(np.random.default_rng(2), 500, 2)
    model = CORD().fit(p0, q)
    assert_matches_reference(model, p0, q)


def test_thousand_classes():
    p0, q = pairs(np.random.default_rng(5), 60, 1000, scale=4.0)
    model = CORD().fit(p0, q)
    assert_matches_reference(model, p0, q)


def test_huge_logits_give_exact_zeros_and_ones():
    rng = np.random.default_rng(4)
    z = rng.normal(size=(100, 10)) * 1e4
    p0, q = softmax(z), softmax(z[:, ::-1] * 0.9)
    assert (p0 == 0).any() and (p0 == 1).any()
    model = CORD().fit(p0, q)
    assert_matches_reference(model, p0, q)
    assert (model.transform(p0, q).argmax(axis=1) == p0.argmax(axis=1)).all()


def test_float32_inputs_match_float64():
    p0, q = pairs(np.random.default_rng(6), 300, 10)
    p32, q32 = p0.astype(np.float32), q.astype(np.float32)
    model = CORD().fit(p32, q32)
    out = model.transform(p32, q32)
    assert out.dtype == np.float64
    reference = CORD().fit(p32.astype(np.float64), q32.astype(np.float64))
    assert model.eta_ == reference.eta_
    assert (out.argmax(axis=1) == p32.argmax(axis=1)).all()


# --- variants -----------------------------------------------------------------------------

def test_none_target_is_independent_projection():
    p0, q = pairs(np.random.default_rng(8), 200, 5)
    model = CORD(mean_target="none").fit(p0, q)
    assert model.eta_ == 0.0
    a = p0.argmax(axis=1)
    rows = np.arange(len(a))
    rest = q.copy()
    rest[rows, a] = 0
    rho = rest.max(axis=1) / rest.sum(axis=1)
    b = q[rows, a]
    g = np.where(q.argmax(axis=1) == a, b, (b + p0[rows, a]) / 2)
    s = np.clip(g, rho / (1 + rho) + EPS_NUM, 1 - EPS_NUM)
    np.testing.assert_allclose(model.transform(p0, q)[rows, a], s, rtol=0, atol=1e-15)


def test_minimal_repair():
    p0, q = pairs(np.random.default_rng(9), 300, 5)
    out = minimal_repair(p0, q)
    a = p0.argmax(axis=1)
    kept = q.argmax(axis=1) == a
    assert kept.any() and (~kept).any()
    np.testing.assert_array_equal(out[kept], q[kept])
    assert (out.argmax(axis=1) == a).all()
    rows = np.flatnonzero(~kept)
    rest = q[rows].copy()
    rest[np.arange(len(rows)), a[rows]] = 0
    rho = rest.max(axis=1) / rest.sum(axis=1)
    np.testing.assert_allclose(out[rows, a[rows]], rho / (1 + rho) + EPS_NUM, atol=1e-15)


def test_local_weight_moves_only_flipped_rows():
    p0, q = pairs(np.random.default_rng(10), 300, 5)
    zero = CORD(mean_target="none", local_weight=0.0).fit_transform(p0, q)
    one = CORD(mean_target="none", local_weight=1.0).fit_transform(p0, q)
    kept = q.argmax(axis=1) == p0.argmax(axis=1)
    np.testing.assert_array_equal(zero[kept], one[kept])
    assert not np.allclose(zero[~kept], one[~kept])


# --- the whole-array listing and the row-blocked sweep ----------------------------------

@pytest.mark.parametrize("n, k", [(700, 3), (2000, 10), (900, 33), (300, 1000)])
def test_matches_numpy_listing(n, k):
    """cord_ops against tests/core/cord_listing.py, the numpy listing the benchmark times."""
    p0, q = pairs(np.random.default_rng(k), n, k)
    q[::7, -1] = 0.0  # boundary rows of q
    q /= q.sum(axis=1, keepdims=True)
    model = CORD().fit(p0, q)
    eta, mu = listing.fit(p0, q)
    assert model.mu_ == pytest.approx(mu, rel=1e-13)
    slope = ref.mean_slope(eta, p0, q)
    assert abs(model.eta_ - eta) <= TOL * (1.0 + abs(eta)) + 8 * np.spacing(mu) / slope
    np.testing.assert_allclose(model.transform(p0, q), listing.transform(eta, p0, q),
                               rtol=0, atol=TOL)


def _fit_and_transform(p0, q):
    model = CORD().fit(p0, q)
    return model.eta_, model.mu_, model.transform(p0, q)


@settings(max_examples=40, deadline=None)
@given(output_pairs(max_n=60, max_k=40), st.sampled_from([64, 200, 1 << 18]),
       st.booleans())
def test_blocks_layouts_and_screening_do_not_change_a_bit(pair, block_bytes, columns):
    """The sweep's block size, its row- or column-wise kernel and the bisection's cheap
    screening are speed choices only: every output is identical bit for bit to one block,
    row-wise reductions and exact evaluations at every bisection step."""
    p0, q = pair
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cord_kernels, "COLUMNWISE_MAX_K", 0)
        mp.setattr(cord_solve, "screen_margin", lambda n: np.inf)
        mp.setattr(validation, "BLOCK_BYTES", 1 << 40)
        eta, mu, out = _fit_and_transform(p0, q)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cord_kernels, "COLUMNWISE_MAX_K", 1000 if columns else 0)
        mp.setattr(validation, "BLOCK_BYTES", block_bytes)
        eta2, mu2, out2 = _fit_and_transform(p0, q)
    assert (eta2, mu2) == (eta, mu)
    np.testing.assert_array_equal(out2, out)


@pytest.mark.parametrize("k", [2, 5, 7, 8, 9, 16, 17, 100, 128, 129, 257, 1000])
def test_column_sums_follow_numpys_row_order(k):
    """pairwise_column_sum must add in the order numpy sums a row; a numpy that changes
    its summation order fails here (the sweep would then differ from it by an ulp)."""
    rng = np.random.default_rng(k)
    rows = rng.random((64, k)) * rng.choice([1e-12, 1.0, 1e9], size=(64, k))
    np.testing.assert_array_equal(pairwise_column_sum(np.ascontiguousarray(rows.T)),
                                  rows.sum(axis=1))


@pytest.mark.parametrize("columns", [True, False])
def test_whole_array_check_has_the_last_word(columns, monkeypatch):
    """When a block check and the whole-array check disagree (conceivable only for a row
    sum within an ulp of the tolerance, summed in another order), the whole-array check
    decides: here every block check fails, the inputs are valid, and the results stand."""
    p0, q = pairs(np.random.default_rng(9), 50, 4 if columns else 40)
    eta, mu, out = _fit_and_transform(p0, q)
    monkeypatch.setattr(cord_kernels, "probability_rows_ok", lambda *args, **kwargs: False)
    assert _fit_and_transform(p0, q)[:2] == (eta, mu)
    np.testing.assert_array_equal(_fit_and_transform(p0, q)[2], out)


@pytest.mark.parametrize("columns", [True, False])
def test_bad_row_in_a_later_block_is_named(columns, monkeypatch):
    monkeypatch.setattr(cord_kernels, "COLUMNWISE_MAX_K", 1000 if columns else 0)
    monkeypatch.setattr(validation, "BLOCK_BYTES", 8 * 3 * 5)  # five rows per block
    p0, q = pairs(np.random.default_rng(5), 40, 3)
    bad_q = q.copy()
    bad_q[23, 1] = np.nan
    with pytest.raises(ValueError, match=r"calibrated: row 23 contains NaN or inf"):
        CORD().fit(p0, bad_q)
    bad_p0 = p0.copy()
    bad_p0[31] *= 1.01
    bad_q[2, 0] = -1.0
    with pytest.raises(ValueError, match=r"original: row 31 sums to .*expected rows"):
        CORD().fit(bad_p0, bad_q)  # p0's error is reported before q's
    model = CORD().fit(p0, q)
    with pytest.raises(ValueError, match=r"original: row 31 sums to"):
        model.transform(bad_p0, q)


# --- real data ------------------------------------------------------------------------------

@requires_shared
def test_real_cifar100_logits_against_transcription():
    logits, _ = load_shared("cifar100_resnet56")
    rng = np.random.default_rng(0)
    idx = rng.permutation(len(logits))
    p0 = softmax(logits)
    w = rng.uniform(0.5, 1.2, size=logits.shape[1])
    q = softmax(logits * w + rng.normal(scale=0.5, size=logits.shape[1]))
    cal, ev = idx[:1500], idx[5000:5300]
    model = CORD().fit(p0[cal], q[cal])
    eta, _ = ref.fit(p0[cal], q[cal])
    assert abs(model.eta_ - eta) <= TOL * (1 + abs(eta))
    expected = np.array(ref.transform(eta, p0[ev], q[ev]))
    out = model.transform(p0[ev], q[ev])
    np.testing.assert_allclose(out, expected, rtol=0, atol=TOL)
    assert (out.argmax(axis=1) == p0[ev].argmax(axis=1)).all()


# --- persistence ------------------------------------------------------------------------------

def test_json_round_trip_is_exact(tmp_path):
    p0, q = pairs(np.random.default_rng(12), 300, 5)
    model = CORD(mean_target="local", local_weight=0.3).fit(p0, q)
    path = tmp_path / "cord.json"
    model.save(path)
    state = json.loads(path.read_text())
    assert float(state["eta_star_repr"]) == model.eta_
    loaded = CORD.load(path)
    assert loaded.eta_ == model.eta_
    np.testing.assert_array_equal(loaded.transform(p0, q), model.transform(p0, q))


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not a readable CORD state"),
        ('{"kind": "cord"}', "missing keys"),
        ('{"kind": "other"}', "kind 'cord'"),
        ("[1, 2]", "kind 'cord'"),
    ],
)
def test_corrupt_state_files(tmp_path, content, message):
    path = tmp_path / "cord.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        CORD.load(path)


def test_state_with_other_constants_is_rejected():
    p0, q = pairs(np.random.default_rng(13), 50, 3)
    state = CORD().fit(p0, q).to_dict()
    state["eps_num"] = 1e-9
    with pytest.raises(ValueError, match="constants"):
        CORD.from_dict(state)


# --- validation -------------------------------------------------------------------------------

GOOD = softmax(np.random.default_rng(14).normal(size=(6, 3)))


def _with(row, col, value, base=GOOD):
    out = base.copy()
    out[row, col] = value
    return out


@pytest.mark.parametrize(
    "original, calibrated, error, message",
    [
        (_with(2, 1, np.nan), GOOD, ValueError, r"original: row 2 contains NaN or inf"),
        (GOOD, _with(4, 0, np.inf), ValueError, r"calibrated: row 4 contains NaN or inf"),
        (GOOD[0], GOOD, ValueError, r"original: expected a 2-D array"),
        (GOOD, GOOD[None], ValueError, r"calibrated: expected a 2-D array"),
        (GOOD[:0], GOOD[:0], ValueError, r"original: expected at least one row"),
        (GOOD[:, :1] / GOOD[:, :1], GOOD[:, :1] / GOOD[:, :1], ValueError, r"K >= 2"),
        (GOOD, GOOD[:4], ValueError, r"calibrated: expected 6 rows to match original"),
        (GOOD, softmax(np.ones((6, 4))), ValueError, r"calibrated: expected 3 classes"),
        (_with(3, 0, -0.1), GOOD, ValueError, r"original: row 3 has a negative entry"),
        (GOOD, GOOD * 1.5, ValueError, r"calibrated: row 0 sums to .*expected rows summing"),
        (GOOD.astype(object), GOOD, TypeError, r"original: expected a real numeric array"),
        (GOOD, GOOD.astype(str), TypeError, r"calibrated: expected a real numeric array"),
    ],
)
def test_bad_input_is_rejected(original, calibrated, error, message):
    with pytest.raises(error, match=message):
        CORD().fit(original, calibrated)


def test_transform_before_fit():
    with pytest.raises(NotFittedError, match="fit"):
        CORD().transform(GOOD, GOOD)


def test_transform_with_other_class_count():
    model = CORD().fit(GOOD, GOOD)
    other = softmax(np.ones((2, 4)))
    with pytest.raises(ValueError, match="original: expected 3 classes"):
        model.transform(other, other)


@pytest.mark.parametrize(
    "options, message",
    [({"mean_target": "median"}, "mean_target"), ({"local_weight": 1.5}, "local_weight")],
)
def test_bad_options(options, message):
    with pytest.raises(ValueError, match=message):
        CORD(**options).fit(GOOD, GOOD)


def test_subnormal_tail_with_negative_multiplier_stays_finite():
    # eta* = -2 sends a row with b = 1 to s = 1/2; (1 - s) / tail overflows for a
    # subnormal tail, yet the repair is simply (s, 1 - s).
    state = CORD().fit(GOOD, GOOD).to_dict()
    state.update(eta_star=-2.0, eta_star_repr="-2.0", n_classes=2)
    model = CORD.from_dict(state)
    p0 = np.array([[0.6, 0.4], [0.7, 0.3]])
    q = np.array([[1.0, 1e-310], [0.6, 0.4]])
    out = model.transform(p0, q)
    assert np.isfinite(out).all()
    s = 0.5 + EPS_NUM
    np.testing.assert_allclose(out[0], [s, 1 - s], rtol=0, atol=1e-15)
    assert (out.argmax(axis=1) == 0).all()
