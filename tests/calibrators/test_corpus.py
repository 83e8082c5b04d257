"""Every calibrator on real classifier outputs (tests/corpus.py): fit, calibrate,
CORD, TPCR 0 after the repair, on the covering subset of the corpus (every model with
every input kind and dtype on binary and multi-class data, and every pathology: exact
zeros and ones, top-1 ties, saturated and off-simplex float32 rows, logits of magnitude
1e4, imbalance, K up to 12). Expected values come from numpy on the stored arrays, never
from cord_ops."""

from __future__ import annotations

import corpus
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from cord_ops import CORD
from cord_ops.calibrators import CALIBRATOR_NAMES, TOP1_PRESERVING
from cord_ops.calibrators.isotonic import saturation_softmax
from cord_ops.softmax import softmax


def _problems(entry, name: str) -> list[str]:
    """What is wrong with one fitted pipeline on one entry's evaluation split."""
    cal, cord = corpus.fitted(entry.name, name)
    p0 = entry.eval_probs
    q = cal.predict_proba(entry.eval_scores)
    repaired = cord.transform(p0, q)
    top = corpus.top1(p0)
    found = []
    if not np.isfinite(cord.eta_):
        found.append(f"eta* = {cord.eta_}")
    for label, probs in (("calibrated", q), ("repaired", repaired)):
        if not (np.isfinite(probs).all() and (probs >= 0).all()
                and np.allclose(probs.sum(axis=1), 1.0, rtol=0, atol=1e-9)):
            found.append(f"{label} rows are not on the simplex")
    changed = np.flatnonzero(corpus.top1(repaired) != top)
    if changed.size:
        found.append(f"repair changed the top-1 of {changed.size} rows, first {changed[0]}")
    if name in TOP1_PRESERVING:
        moved = np.flatnonzero(corpus.top1(q) != top)
        if moved.size:
            found.append(f"top-1 preserving map changed {moved.size} rows, first {moved[0]}")
    return [f"{entry.name}: {p}" for p in found]


@pytest.mark.parametrize("name", CALIBRATOR_NAMES)
def test_every_calibrator_on_the_covering_corpus(name):
    """One test per family over every covering entry, so a failure lists every entry."""
    problems = [p for e in corpus.covering() for p in _problems(e, name)]
    assert problems == []


def test_the_covering_subset_carries_every_pathology_and_model():
    """The cross product above is only as good as its coverage: every tag of the corpus and
    every model appear, binary and multi-class, both kinds and both dtypes."""
    chosen = corpus.covering()
    assert set().union(*(e.pathologies for e in chosen)) == set(corpus.PATHOLOGIES)
    assert {e.model for e in chosen} == {s.model for s in corpus.SOURCES}
    assert {(e.kind, e.dtype) for e in chosen if e.n_classes == 2} == {
        (k, d) for k in corpus.KINDS for d in corpus.DTYPES}
    assert {e.model for e in chosen if e.n_classes == 2} == {s.model for s in corpus.SOURCES}


def test_the_corpus_has_what_real_pipelines_write():
    """The pathologies are measured on the stored arrays: real k-NN / forest outputs tie
    at the top and hold exact 0 and 1, float32 probability rows miss 1, naive Bayes
    saturates, and binary models log one score column."""
    knn = corpus.entry("digits-knn-probs-float32")
    assert knn.has("top1_tie", "exact_zero", "exact_one", "off_simplex")
    assert np.all(np.isin(np.round(knn.cal_scores.astype(np.float64) * 5, 5),
                          np.arange(6)))  # multiples of 1/5
    gnb = corpus.entry("digits-gnb-logits-float64")
    assert gnb.has("huge_logits")
    one = corpus.entry("breast_cancer-logreg-logits-float32-1col")
    assert one.cal_scores.shape == (len(one.cal_labels), 1) and one.columns == 1
    two = corpus.entry("breast_cancer-logreg-logits-float32")
    np.testing.assert_array_equal(two.cal_scores[:, 1], one.cal_scores[:, 0])
    assert (two.cal_scores[:, 0] == 0).all()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpus.logit_rows(dtype="float64", kinds=("huge", "normal", "tie", "offset")))
def test_saturation_softmax_is_the_softmax_with_an_order_free_top_entry(z):
    """The isotonic families' softmax: within a few ulps of exp / sum, the tie rule kept,
    and on saturated rows (the others' sum s below 1e-10, where isotonic knots sit ulps
    apart) the top entry is 1 / (1 + s) however s is summed: here in reverse class order."""
    p = saturation_softmax(z)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    np.testing.assert_allclose(p, e / e.sum(axis=1, keepdims=True), rtol=1e-13, atol=1e-300)
    top = np.argmax(z, axis=1)
    np.testing.assert_array_equal(np.argmax(p, axis=1), top)
    rows = np.arange(len(z))
    others = e.copy()
    others[rows, top] = 0.0
    reverse = others[:, ::-1].sum(axis=1)
    saturated = reverse < 1e-10
    np.testing.assert_array_equal(p[rows, top][saturated], 1.0 / (1.0 + reverse[saturated]))


def test_saturated_top_entries_no_longer_depend_on_the_class_order():
    """A naive-Bayes-like row whose top-1 is 1 - 8e-14. The plain
    softmax adds the 1 in class order, so the top entry moves by an ulp with the position
    of the top class; isotonic knots an ulp apart turned that into 1e-3 of probability."""
    z = np.array([[0.0, -35.7, -31.5, -33.9, -39.7, -37.6, -39.4, -30.8, -36.1, -33.0]])
    moved = np.roll(z, 1, axis=1)
    assert softmax(z)[0, 0] != softmax(moved)[0, 1]  # the case under test happens
    assert saturation_softmax(z)[0, 0] == saturation_softmax(moved)[0, 1] < 1.0


@pytest.mark.parametrize("name", CALIBRATOR_NAMES)
def test_pathological_rows_through_every_numpy_pipeline(name):
    """Rows the strategies generate (exact zeros, top-1 ties, float32 rounding, saturated
    and one-hot rows) through each family fitted on k-NN votes: calibrated rows on the
    simplex, and CORD, fitted on those very rows and on the corpus, keeps every top-1."""
    e = corpus.entry("digits-knn-probs-float32")
    cal, cord = corpus.fitted(e.name, name)

    @settings(max_examples=15, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(corpus.probability_rows(k=e.n_classes, n_rows=(2, 24)))
    def check(p):
        q = cal.predict_proba(p)
        assert np.isfinite(q).all() and (q >= 0).all()
        np.testing.assert_allclose(q.sum(axis=1), 1.0, rtol=0, atol=1e-9)
        for repair in (cord, CORD().fit(p, q)):
            np.testing.assert_array_equal(corpus.top1(repair.transform(p, q)), corpus.top1(p))

    check()
