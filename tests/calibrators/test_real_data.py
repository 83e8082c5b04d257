"""The calibrators on the real CIFAR logits of the shared data folder (skipped on a fresh
clone):
calibration half = first 5,000 of ``np.random.default_rng(0).permutation(10000)``,
evaluation half = the rest. One module-scoped fit per (file, calibrator)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import load_shared, requires_shared, shared_files

from cord_ops.calibrators import CALIBRATOR_NAMES, make_calibrator
from cord_ops.metrics import brier, nll
from cord_ops.softmax import softmax
from cord_ops.validation import top1

pytestmark = [requires_shared, pytest.mark.shared_data]

FILES = [path.stem for path in shared_files()]
CIFAR10 = [stem for stem in FILES if stem.startswith("cifar10_")]


def _halves(stem):
    logits, labels = load_shared(stem)
    perm = np.random.default_rng(0).permutation(logits.shape[0])
    cal, ev = perm[:5000], perm[5000:]
    return logits[cal], labels[cal], logits[ev], labels[ev]


@pytest.fixture(scope="module")
def cifar10_fits():
    out = {}
    for stem in CIFAR10:
        zc, yc, ze, ye = _halves(stem)
        for name in CALIBRATOR_NAMES:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                cal = make_calibrator(name).fit(zc, yc)
            out[stem, name] = (cal, cal.predict_proba(ze), ze, ye, len(caught))
    return out


# IROvA's per-class step functions put near-zero mass on the true class of a few evaluation
# rows; on RepVGG-A1 (already the best-calibrated CIFAR-10 model) that outweighs its gain:
# evaluation NLL 0.2171 vs 0.2123 uncalibrated on this split. The peers show the same
# (probmetrics/sklearn IROvA: 0.2395 vs 0.2216, five-seed means, anchors table); its Brier
# score still improves (test below). Strict: the test fails if this ever changes.
NLL_EXCEPTIONS = {("cifar10_repvgg_a1", "irova")}


def _nll_case(stem, name):
    if (stem, name) in NLL_EXCEPTIONS:
        return pytest.param(stem, name, marks=pytest.mark.xfail(
            strict=True, reason="IROvA raises NLL on RepVGG-A1, as in the peers' results"))
    return pytest.param(stem, name)


@pytest.mark.parametrize(("stem", "name"),
                         [_nll_case(s, n) for s in CIFAR10 for n in CALIBRATOR_NAMES])
def test_every_calibrator_lowers_evaluation_nll_on_cifar10(stem, name, cifar10_fits):
    _, q, ze, ye, n_warnings = cifar10_fits[stem, name]
    assert n_warnings == 0  # every CIFAR-10 fit converges
    assert np.max(np.abs(q.sum(axis=1) - 1.0)) <= 1e-12
    assert nll(q, ye) < nll(softmax(ze), ye)


@pytest.mark.parametrize("stem", CIFAR10)
@pytest.mark.parametrize("name", ["irova", "irova-ts", "irm"])
def test_isotonic_maps_lower_the_brier_score_on_cifar10(stem, name, cifar10_fits):
    _, q, ze, ye, _ = cifar10_fits[stem, name]
    assert brier(q, ye) < brier(softmax(ze), ye)


@pytest.mark.parametrize("stem", CIFAR10)
def test_ts_and_irm_keep_every_top1_on_cifar10(stem, cifar10_fits):
    for name in ("ts", "irm"):
        _, q, ze, _, _ = cifar10_fits[stem, name]
        assert np.array_equal(top1(q), top1(ze))


@pytest.mark.parametrize("stem", [s for s in FILES if s.startswith("cifar100_")])
def test_ts_and_irm_keep_every_top1_on_cifar100(stem):
    zc, yc, ze, _ = _halves(stem)
    for name in ("ts", "irm"):
        q = make_calibrator(name).fit(zc, yc).predict_proba(ze)
        assert np.array_equal(top1(q), top1(ze))


# probmetrics 1.3.0 five-seed mean evaluation NLL on CIFAR-10 (anchors table, 4 decimals,
# one copy in tests/data shared with benchmarks/bench_calibrators.py), same protocol:
# seeds 0-4, calibrators fed p0 = softmax(logits) as probabilities.
_ANCHORS = json.loads((Path(__file__).resolve().parents[1] / "data" /
                       "probmetrics_cifar.json").read_text())["five_seed_mean_nll"]
PEER_NLL_CIFAR10 = {stem: {name: values[name] for name in ("ts", "vs", "ms", "svs", "sms")}
                    for stem, values in _ANCHORS.items() if stem.startswith("cifar10_")}


@pytest.mark.parametrize("stem", sorted(PEER_NLL_CIFAR10))
def test_five_seed_nll_matches_probmetrics_within_1e4(stem):
    if stem not in CIFAR10:
        pytest.skip(f"{stem} not in ../shared/data")
    logits, labels = load_shared(stem)
    p0 = softmax(logits)
    ours = {name: [] for name in PEER_NLL_CIFAR10[stem]}
    for seed in range(5):
        perm = np.random.default_rng(seed).permutation(labels.shape[0])
        cal, ev = perm[:5000], perm[5000:]
        for name in ours:
            fitted = make_calibrator(name, input_kind="probs").fit(p0[cal], labels[cal])
            ours[name].append(nll(fitted.predict_proba(p0[ev]), labels[ev]))
    for name, values in ours.items():
        # 1e-4 target plus half a unit of the anchors' fourth decimal.
        assert abs(np.mean(values) - PEER_NLL_CIFAR10[stem][name]) <= 1.5e-4, name
