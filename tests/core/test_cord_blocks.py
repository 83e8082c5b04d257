"""CORD.fit_blocks: one pass over row blocks gives fit's eta* and mu bit for bit, however
the rows are split, and a bad block is reported with the row counted globally."""

from __future__ import annotations

import numpy as np
import pytest
from core.test_cord import output_pairs, pairs
from hypothesis import given, settings
from hypothesis import strategies as st

from cord_ops import CORD


def split_rows(n, cuts):
    """Row slices of range(n) cut at the given sorted, distinct positions."""
    edges = [0, *cuts, n]
    return [slice(lo, hi) for lo, hi in zip(edges[:-1], edges[1:], strict=True)]


@st.composite
def split_pairs(draw):
    p0, q = draw(output_pairs(max_n=60, max_k=40))
    n = p0.shape[0]
    cuts = sorted(draw(st.sets(st.integers(1, max(1, n - 1)), max_size=6))) if n > 1 else []
    return p0, q, cuts


@settings(max_examples=150, deadline=None)
@given(split_pairs(), st.sampled_from(["inherited", "none", "local", "pointwise"]),
       st.sampled_from([0.0, 0.5, 0.9]))
def test_blocks_equal_fit_bit_for_bit(case, target, lam):
    p0, q, cuts = case
    whole = CORD(mean_target=target, local_weight=lam).fit(p0, q)
    # Blocks as a generator of views and of float32-free copies: nothing is kept by fit_blocks.
    blocks = ((p0[rows], q[rows].copy()) for rows in split_rows(p0.shape[0], cuts))
    streamed = CORD(mean_target=target, local_weight=lam).fit_blocks(blocks)
    assert streamed.eta_.hex() == whole.eta_.hex()
    assert streamed.mu_.hex() == whole.mu_.hex()
    assert (streamed.n_fit_, streamed.n_classes_) == (whole.n_fit_, whole.n_classes_)


@pytest.mark.parametrize("k", [10, 100])
def test_many_blocks_on_larger_data(k):
    p0, q = pairs(np.random.default_rng(k), 20_000, k)
    whole = CORD().fit(p0, q)
    rng = np.random.default_rng(1)
    cuts = sorted(set(rng.integers(1, 20_000, size=40).tolist()))
    streamed = CORD().fit_blocks((p0[r], q[r]) for r in split_rows(20_000, cuts))
    assert streamed.eta_.hex() == whole.eta_.hex()
    assert whole.eta_ != 0.0  # a real bisection ran
    np.testing.assert_array_equal(streamed.transform(p0, q), whole.transform(p0, q))


def test_bad_row_is_named_globally():
    p0, q = pairs(np.random.default_rng(3), 30, 4)
    q[23, 1] = -0.1
    with pytest.raises(ValueError, match=r"^calibrated: row 23 has a negative entry"):
        CORD().fit_blocks((p0[r], q[r]) for r in split_rows(30, [10, 20]))
    p0[17, 0] = np.nan
    with pytest.raises(ValueError, match=r"^original: row 17 contains NaN|^original: row 17"):
        CORD().fit_blocks((p0[r], q[r]) for r in split_rows(30, [10, 20]))


def test_block_with_other_width_and_no_blocks():
    p0, q = pairs(np.random.default_rng(4), 20, 4)
    p1, q1 = pairs(np.random.default_rng(5), 20, 5)
    with pytest.raises(ValueError, match=r"original: expected 4 classes \(columns\), got 5"):
        CORD().fit_blocks([(p0, q), (p1, q1)])
    with pytest.raises(ValueError, match="expected at least one"):
        CORD().fit_blocks([])


def test_blocks_are_consumed_once():
    p0, q = pairs(np.random.default_rng(6), 100, 3)
    seen = []

    def blocks():
        for rows in split_rows(100, [33, 66]):
            seen.append(rows.start)
            yield p0[rows], q[rows]

    CORD().fit_blocks(blocks())
    assert seen == [0, 33, 66]


def test_memory_holds_one_block_and_the_row_scalars():
    """20 blocks of 1,000 rows at K = 500 (80 MB of pairs in all, 4 MB a block array):
    fit_blocks' peak allocation stays near one block's, not the data's."""
    import tracemalloc

    n_blocks, rows, k = 20, 1000, 500

    def blocks():
        for i in range(n_blocks):
            yield pairs(np.random.default_rng(i), rows, k)

    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        CORD().fit_blocks(blocks())
        peak = tracemalloc.get_traced_memory()[1] - baseline
    finally:
        tracemalloc.stop()
    block_bytes = rows * k * 8
    # one block pair being generated (z, logits and both softmaxes: ~6 block arrays) plus
    # the sweep's working copy; the whole data would be 40 block arrays
    assert peak < 12 * block_bytes, peak / block_bytes


def test_the_public_fit_helpers_give_fits_eta_and_mu():
    """What a driver that fits outside ``CORD.fit`` uses (cord_ops.reduce, flows.shards):
    the row scalars of all rows give fit's eta* and mu bit for bit, a recorded fit
    transforms as fit's does, and bad parameters fail the same check."""
    from cord_ops.cord import check_cord_params, fit_from_row_scalars, set_fitted
    from cord_ops.cord_kernels import row_scalars

    rng = np.random.default_rng(3)
    p0 = rng.dirichlet(np.ones(5), size=200)
    q = rng.dirichlet(np.ones(5) * 0.5, size=200)
    for target in ("inherited", "none", "local", "pointwise"):
        fitted = CORD(mean_target=target).fit(p0, q)
        b, lower, g = row_scalars(p0, q, 0.5)
        again = fit_from_row_scalars(CORD(mean_target=target), b, lower, g, 5)
        assert (again.eta_, again.mu_, again.n_fit_) == (fitted.eta_, fitted.mu_, 200)
        recorded = set_fitted(CORD(mean_target=target), fitted.eta_, fitted.mu_, 200, 5)
        assert np.array_equal(recorded.transform(p0, q), fitted.transform(p0, q))
        assert recorded.n_classes_ == recorded.n_features_in_ == 5
    check_cord_params(CORD())
    with pytest.raises(ValueError, match="mean_target"):
        check_cord_params(CORD(mean_target="median"))
    with pytest.raises(ValueError, match="local_weight"):
        check_cord_params(CORD(local_weight=2.0))
