"""Fixtures of the onnx_export tests: fitted calibrator + CORD pairs on synthetic splits,
adversarial inputs, and the cord_ops reference every graph output is compared with."""

from __future__ import annotations

import functools
import sys
import warnings

import numpy as np
import pytest
from corpus import FIT_OPTIONS

from cord_ops import CORD
from cord_ops.calibrators import ConvergenceWarning, make_calibrator
from cord_ops.softmax import softmax
from onnx_export.runtime import open_session

#: Options that keep every fit well under a second (one table with the corpus's).
FAST = FIT_OPTIONS
#: Parity bounds of docs/contract.md per graph dtype.
TOLERANCE = {"float64": 1e-12, "float32": 1e-5}


def synthetic_split(k: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Logits of an overconfident classifier (about 70% top-1) and labels."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n)
    signal = np.zeros((n, k))
    signal[np.arange(n), labels] = rng.uniform(1.0, 4.0, n)
    logits = 2.5 * (signal + rng.normal(0.0, 1.0, (n, k)))
    return logits, labels


def scores_of(logits: np.ndarray, input_kind: str) -> np.ndarray:
    return logits if input_kind == "logits" else softmax(logits)


#: At K = 1,000 the K x K families get a few iterations on a small split: the state is
#: still a genuine fitted one (cap reached), and a full fit would take minutes.
FAST_WIDE = {"max_iter": 3}


@functools.cache
def fitted(name: str, k: int, input_kind: str) -> tuple:
    """(calibrator, CORD) fitted by cord_ops on a synthetic calibration split."""
    full_matrix = name in ("ms", "sms", "dir-odir")
    n = 1200 if k <= 100 else (300 if full_matrix else 1500)
    logits, labels = synthetic_split(k, n, seed=k)
    scores = scores_of(logits, input_kind)
    options = {**FAST.get(name, {}), **(FAST_WIDE if full_matrix and k > 100 else {})}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        cal = make_calibrator(name, input_kind=input_kind, **options)
        cal.fit(scores, labels)
    cord = CORD().fit(softmax(logits), cal.predict_proba(scores))
    return cal, cord


def with_eta(cord: CORD, eta: float, local_weight: float | None = None) -> CORD:
    """A copy of a fitted CORD with another eta* (to reach every branch of eqs. 19-20)."""
    state = cord.to_dict()
    state["eta_star"], state["eta_star_repr"] = eta, repr(eta)
    if local_weight is not None:
        state["local_weight"] = local_weight
    return CORD.from_dict(state)


def adversarial_logits(k: int, seed: int) -> np.ndarray:
    """float32 logits with the rows that break naive exports: exact ties and one-ulp
    near-ties between the top two (the runner-up at a smaller and at a larger index; also
    among logits of magnitude 0.01, whose float32 softmax ties), zero
    and constant rows, magnitude 1e4 (spread and offset), dominant classes whose softmax
    underflows in float32 (gap 120) or to exact zeros in float64 (gap 1500, boundary rows),
    and close top-two gaps where calibrators flip the argmax. (Subnormal float64 tails,
    gaps near 720, have their own test in test_parity.py.)"""
    rng = np.random.default_rng(seed)
    rows = [rng.normal(0.0, 3.0, (24, k))]

    def top_two(m):
        block = rng.normal(0.0, 3.0, (m, k))
        a = block.argmax(axis=1)
        c = (a + 1 + rng.integers(0, k - 1, m)) % k
        return block, np.arange(m), a, c

    block, i, a, c = top_two(8)
    block[i, c] = block[i, a]
    rows.append(block)
    block, i, a, c = top_two(8)
    block = block.astype(np.float32)
    block[i, c] = np.nextafter(block[i, a], np.float32(-np.inf))
    block[i[::2], c[::2]] = np.nextafter(block[i[::2], a[::2]], np.float32(np.inf))
    rows.append(block)
    # Near-ties among small logits, where float32 exp rounds both to the same value.
    block, i, a, c = top_two(8)
    block = (block / 100.0).astype(np.float32)
    block[i, c] = np.nextafter(block[i, a], np.float32(-np.inf))
    rows.append(block)
    block, i, a, c = top_two(8)
    block[i, c] = block[i, a] - rng.uniform(0.0, 0.2, 8)
    rows.append(block)
    rows += [np.zeros((2, k)), np.full((1, k), 7.5)]
    rows += [1e4 * rng.normal(size=(3, k)), 1e4 + rng.normal(size=(3, k)),
             -1e4 + rng.normal(size=(2, k))]
    for gap in (120.0, 1500.0):
        block = rng.normal(0.0, 1.0, (2, k))
        block[np.arange(2), rng.integers(0, k, 2)] += gap
        rows.append(block)
    return np.concatenate(rows).astype(np.float32)


def adversarial_scores(k: int, input_kind: str, seed: int) -> np.ndarray:
    """Adversarial float32 inputs of either kind; probabilities add one-hot, uniform and
    tied rows (exact zeros put them on the simplex boundary)."""
    logits = adversarial_logits(k, seed)
    if input_kind == "logits":
        return logits
    probs = softmax(logits.astype(np.float64))
    onehot = np.eye(k)[[0, k - 1]]
    tied = np.zeros((1, k))
    tied[0, [k - 1, 0]] = 0.5
    return np.concatenate([probs, onehot, np.full((1, k), 1.0 / k), tied]).astype(np.float32)


def reference(cal, cord: CORD, scores: np.ndarray) -> dict[str, np.ndarray]:
    """What cord_ops computes on the same inputs, upcast to float64."""
    x = scores.astype(np.float64)
    original = softmax(x) if cal.input_kind == "logits" else x
    calibrated = cal.predict_proba(x)
    repaired = cord.transform(original, calibrated)
    label = np.argmax(original, axis=1)
    return {"original": original, "calibrated": calibrated, "repaired": repaired,
            "label": label, "confidence": repaired[np.arange(len(label)), label]}


def max_abs_diffs(outputs: dict, expected: dict) -> dict[str, float]:
    return {key: float(np.max(np.abs(outputs[key].astype(np.float64) - expected[key])))
            for key in ("repaired", "calibrated", "original", "confidence")}


def assert_parity(outputs: dict, expected: dict, dtype: str) -> dict[str, float]:
    """Parity of docs/contract.md: max-abs bound per dtype on every output, identical
    labels, and the label on top of both ``repaired`` and ``original`` on every row."""
    diffs = max_abs_diffs(outputs, expected)
    assert all(d <= TOLERANCE[dtype] for d in diffs.values()), diffs
    label = outputs["label"]
    assert label.dtype == np.int64
    np.testing.assert_array_equal(label, expected["label"])
    np.testing.assert_array_equal(np.argmax(outputs["repaired"], axis=1), label)
    np.testing.assert_array_equal(np.argmax(outputs["original"], axis=1), label)
    return diffs


@pytest.fixture(scope="session")
def cases():
    """This module's helpers (test modules cannot import a sibling module by name)."""
    return sys.modules[__name__]


@pytest.fixture(scope="session")
def run_model():
    """run_model(model, scores, provider="cpu") -> {output name: array}."""

    def run(model, scores, provider="cpu"):
        session = open_session(model, provider=provider, threads=1)
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, {"scores": scores}), strict=True))

    return run
