"""Evaluation metrics for n x K probability reports (docs/contract.md "Metrics", paper Section 4).

Every function validates its inputs with :mod:`cord_ops.validation` and derives the top-1
class with :func:`cord_ops.validation.top1` (smallest maximizing index), so ties are
resolved identically in every metric, in CORD and in the ONNX graph.

Confidence-calibration metrics (``ece``, ``ece_em``, ``smece``, ``reliability_diagram``)
work on the pairs (c_i, a_i): c_i = max_k q_ik and a_i = 1[top1(q_i) == y_i].
"""

from __future__ import annotations

import numpy as np

from cord_ops.threshold import decisions, to_decision_space
from cord_ops.validation import check_labels, check_pair, check_probabilities, top1

#: The one floor for log-probabilities (float64 machine epsilon, 2.2e-16): the reported NLL
#: clips the true-class probability to [PROB_FLOOR, 1 - PROB_FLOOR], as sklearn's log_loss
#: does for float64, so a zero probability costs -log(2.2e-16) = 36.04 nats instead of inf;
#: every calibrator takes the log of a probability input (or of its Dirichlet features) as
#: log(max(p, PROB_FLOOR)), so its fit objective and the reported NLL price a zero alike
#: (docs/calibrators.md, "The log floor"). One constant, so "fitted" means "better on the
#: metric we report" wherever the calibrated true-class probability stays above it.
PROB_FLOOR = float(np.finfo(np.float64).eps)

#: Fixed settings of relplot 1.0.3's smECE (Blasiok & Nakkiran 2023), docs/calibrators.md section 7.
SMECE_EPS = 1e-3
SMECE_BISECTION_STEPS = 10
_SMECE_MIN_EVAL_POINTS = 200
_SMECE_MIN_GRID_POINTS = 2000
_SMECE_REGULARIZER = 1e-4


def _validated(probs, labels, name: str = "probs") -> tuple[np.ndarray, np.ndarray]:
    q = check_probabilities(probs, name)
    y = check_labels(labels, q.shape[0], q.shape[1])
    return q, y


def _confidence_correct(q: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(max probability, 1.0 where the top-1 class is the label) per row."""
    pred = top1(q)
    confidence = q[np.arange(q.shape[0]), pred]
    return confidence, (pred == y).astype(np.float64)


def _binned_gap(bins: np.ndarray, confidence: np.ndarray, correct: np.ndarray,
                n_bins: int, p: float) -> float:
    """(sum_b |B_b| |mean_b a - mean_b c|^p / n)^(1/p); empty bins contribute nothing."""
    counts = np.bincount(bins, minlength=n_bins)
    sum_conf = np.bincount(bins, weights=confidence, minlength=n_bins)
    sum_acc = np.bincount(bins, weights=correct, minlength=n_bins)
    filled = counts > 0
    gaps = np.abs(sum_acc[filled] - sum_conf[filled]) / counts[filled]
    return float((np.sum(counts[filled] * gaps**p) / confidence.size) ** (1.0 / p))


def _check_n_bins(n_bins: int) -> int:
    if isinstance(n_bins, bool) or not isinstance(n_bins, int | np.integer) or n_bins < 1:
        raise ValueError(f"n_bins: expected a positive integer, got {n_bins!r}")
    return int(n_bins)


def _equal_width_bins(confidence: np.ndarray, n_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Bin edges linspace(0, 1, B+1) and each confidence's bin in [0, B), bins being (l, u].

    searchsorted(side="left") returns i with edges[i-1] < c <= edges[i], which is exactly
    the half-open (l, u] convention of Guo et al. / gpleiss. Probability rows are accepted
    within a rounding tolerance of summing to 1, so a top-1 probability may exceed 1 by
    that much (a float32 binary row: 1 + 6e-8) and would get bin B; it is counted in the
    last bin, as its exact value 1 would be. (c == 0 is impossible for a max probability,
    c >= 1/K; it would go to the first bin.)
    """
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    bins = np.searchsorted(edges, confidence, side="left") - 1
    return edges, np.clip(bins, 0, n_bins - 1)


def ece(probs, labels, n_bins: int = 15) -> float:
    """Expected calibration error with ``n_bins`` equal-width bins (Guo et al. 2017).

    ECE = sum_b |B_b|/n * |acc(B_b) - conf(B_b)| over bins (l, u] of [0, 1], empty bins
    skipped; the value lies in [0, 1].
    """
    n_bins = _check_n_bins(n_bins)
    q, y = _validated(probs, labels)
    confidence, correct = _confidence_correct(q, y)
    _, bins = _equal_width_bins(confidence, n_bins)
    return _binned_gap(bins, confidence, correct, n_bins, 1.0)


def ece_em(probs, labels, n_bins: int = 15, p: float = 1.0) -> float:
    """Equal-mass ECE (Roelofs et al. 2022; caltrain ``BinEqualExamples``).

    Confidences are sorted (stable sort, so equal confidences keep their row order) and
    the example of rank r (0-based) goes to bin min(B - 1, floor(r B / n)); equal values
    may be split across bins. Returns (sum_b |B_b| |acc_b - conf_b|^p / n)^(1/p). With
    B = 15 and p = 1 it is comparable to :func:`ece`.
    """
    n_bins = _check_n_bins(n_bins)
    if not np.isfinite(p) or p < 1:
        raise ValueError(f"p: expected a finite norm order >= 1, got {p!r}")
    q, y = _validated(probs, labels)
    confidence, correct = _confidence_correct(q, y)
    n = confidence.size
    order = np.argsort(confidence, kind="stable")
    bins = np.empty(n, dtype=np.int64)
    bins[order] = np.minimum(n_bins - 1, (np.arange(n) * n_bins) // n)
    return _binned_gap(bins, confidence, correct, n_bins, float(p))


def _smooth_to_grid(f: np.ndarray, weights: np.ndarray, grid_points: int) -> np.ndarray:
    """Split each weight linearly between the two nodes of a uniform grid on [0, 1]
    around f_i; the last interval is closed, so f = 1 lands wholly on the last node."""
    scaled = f * (grid_points - 1)
    left = scaled.astype(np.int64).clip(0, grid_points - 2)
    frac = scaled - left
    return (np.bincount(left, weights=(1 - frac) * weights, minlength=grid_points)
            + np.bincount(left + 1, weights=frac * weights, minlength=grid_points))


def _reflected_gaussian_smooth(grid: np.ndarray, sigma: float) -> np.ndarray:
    """Convolve grid values on [0, 1] with a Gaussian of width sigma reflected at 0 and 1.

    The kernel is sampled on the same grid (support [-1/2, 1/2], not normalised by the
    grid spacing) and the values are mirrored once on each side before a 'valid'
    convolution, as relplot's ReflectedGaussianKernel does. FFT convolution keeps this at
    O(m log m) when sigma is small and the grid fine.
    """
    m = grid.shape[1]
    t = np.linspace(0.0, 1.0, m)
    kernel = np.exp(-((t - 0.5) ** 2) / (2 * sigma**2)) / (np.sqrt(2 * np.pi) * sigma)
    mirrored = np.concatenate(
        [grid[:, ::-1][:, :-1], grid, grid[:, ::-1][:, 1:]], axis=1
    )
    # Imported here: scipy.signal takes over a second to import, and every command that
    # only validates its inputs imports this module.
    from scipy.signal import fftconvolve

    smoothed = fftconvolve(mirrored, kernel[None, :], mode="valid", axes=1)
    return smoothed[:, m // 2 : m // 2 + m]


def _interpolate(t: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Piecewise-linear interpolation of values[:, j] placed at j / (m - 1), at points t."""
    m = values.shape[1]
    step = 1.0 / (m - 1)
    left = (t * (m - 1)).astype(np.int64).clip(0, m - 2)
    frac = (t - left * step) / step
    return values[:, left] * (1 - frac) + values[:, left + 1] * frac


def smece_at(confidence: np.ndarray, correct: np.ndarray, sigma: float) -> float:
    """smECE at a fixed bandwidth sigma for binary pairs (f_i, y_i) (relplot ``smooth_ece``).

    With the reflected Gaussian kernel K_sigma, on t = linspace(0, 1, max(round(10/sigma),
    200)): r(t) = sum_i K(t, f_i)(f_i - y_i) / d(t) with d(t) = sum_i K(t, f_i) + 1e-4, and
    smECE_sigma = sum_t |r(t)| d(t) / sum_t d(t). Since d > 0, |r(t)| d(t) is simply
    |sum_i K(t, f_i)(f_i - y_i)|. The kernel sums are computed on a grid of
    max(2000, round(20/sigma)) // 2 + 1 nodes and interpolated to t.
    """
    eval_points = max(round(10 / sigma), _SMECE_MIN_EVAL_POINTS)
    grid_points = max(_SMECE_MIN_GRID_POINTS, round(20 / sigma)) // 2 + 1
    t = np.linspace(0.0, 1.0, eval_points)
    grid = np.stack([
        _smooth_to_grid(confidence, confidence - correct, grid_points),
        _smooth_to_grid(confidence, np.ones_like(confidence), grid_points),
    ])
    sums = _interpolate(t, _reflected_gaussian_smooth(grid, sigma))
    density = sums[1] + _SMECE_REGULARIZER
    return float(np.sum(np.abs(sums[0])) / np.sum(density))


def smece(probs, labels) -> float:
    """Smooth ECE (Blasiok & Nakkiran 2023) of the top-1 confidence, as relplot 1.0.3 computes it.

    The bandwidth is the fixed point sigma* of smECE_sigma = sigma: with
    P(sigma) = sigma < 1e-3 or sigma < smECE_sigma, sigma* = 1 if P(1); otherwise 10
    bisection steps on [0, 1] keep ``hi`` where P is false and ``lo`` where it is true,
    and sigma* = hi. Returns smECE_{sigma*} (see :func:`smece_at`). Equals
    ``relplot.smECE(*relplot.multiclass_logits_to_confidences(probs, labels, probs=True))``.
    """
    return smece_with_width(probs, labels)[0]


def smece_with_width(probs, labels) -> tuple[float, float]:
    """(smECE, sigma*) — :func:`smece` together with the bandwidth it selected."""
    q, y = _validated(probs, labels)
    confidence, correct = _confidence_correct(q, y)
    cache: dict[float, float] = {}

    def value(sigma: float) -> float:
        if sigma not in cache:
            cache[sigma] = smece_at(confidence, correct, sigma)
        return cache[sigma]

    def above_fixed_point(sigma: float) -> bool:
        return sigma < SMECE_EPS or sigma < value(sigma)

    hi = 1.0
    if not above_fixed_point(hi):
        lo = 0.0
        for _ in range(SMECE_BISECTION_STEPS):
            mid = (hi + lo) / 2
            if above_fixed_point(mid):
                lo = mid
            else:
                hi = mid
    return value(hi), hi


def nll(probs, labels) -> float:
    """Mean negative log-likelihood -(1/n) sum_i log q_{i, y_i}.

    The true-class probability is clipped to [eps, 1 - eps] with eps = 2.22e-16 (float64
    machine epsilon, :data:`PROB_FLOOR`), as sklearn.metrics.log_loss does, so the value is
    finite even when a row puts zero mass on its label.
    """
    q, y = _validated(probs, labels)
    true_mass = np.clip(q[np.arange(q.shape[0]), y], PROB_FLOOR, 1 - PROB_FLOOR)
    return float(-np.mean(np.log(true_mass)))


def brier(probs, labels) -> float:
    """Multiclass Brier score (1/n) sum_i sum_k (q_ik - 1[y_i = k])^2, in [0, 2]."""
    q, y = _validated(probs, labels)
    residual = q.copy()
    residual[np.arange(q.shape[0]), y] -= 1.0
    return float(np.mean(np.sum(residual**2, axis=1)))


def accuracy(probs, labels, threshold: float | None = None) -> float:
    """Fraction of rows whose top-1 class (smallest maximizing index) equals the label; with
    a binary ``threshold`` t, whose decision at t (:func:`cord_ops.threshold.decisions`)."""
    q, y = _validated(probs, labels)
    return float(np.mean(decisions(q, threshold) == y))


def _validated_reports(reference, probs) -> tuple[np.ndarray, np.ndarray]:
    ref = check_probabilities(reference, "reference")
    q = check_probabilities(probs, "probs")
    check_pair(ref, q, ("reference", "probs"))
    return ref, q


def tpcr(reference, probs, threshold: float | None = None) -> float:
    """Top-1 Prediction Change Rate (paper eq. 10): fraction of rows whose top-1 class
    under ``probs`` differs from that under ``reference`` (the original classifier); with
    a binary ``threshold`` t, the decisions at t are compared instead."""
    ref, q = _validated_reports(reference, probs)
    return float(np.mean(decisions(ref, threshold) != decisions(q, threshold)))


def prediction_changes(reference, probs, labels,
                       threshold: float | None = None) -> dict[str, int]:
    """Counts of the top-1 changes from ``reference`` to ``probs`` by effect (paper Sec. 4).

    ``c_plus``: incorrect -> correct, ``c_minus``: correct -> incorrect, ``c_zero``:
    incorrect -> another incorrect class. Their sum divided by n is :func:`tpcr` and
    (c_plus - c_minus) / n is the accuracy change. With a binary ``threshold`` t, of the
    decisions at t.
    """
    ref, q = _validated_reports(reference, probs)
    y = check_labels(labels, q.shape[0], q.shape[1])
    before, after = decisions(ref, threshold), decisions(q, threshold)
    changed = before != after
    return {
        "c_plus": int(np.sum(changed & (after == y))),
        "c_minus": int(np.sum(changed & (before == y))),
        "c_zero": int(np.sum(changed & (before != y) & (after != y))),
    }


def reliability_diagram(probs, labels, n_bins: int = 15) -> dict[str, np.ndarray]:
    """Per-bin data of a reliability diagram over the equal-width bins of :func:`ece`.

    Returns ``edges`` (B + 1,), and per bin (B,): ``count`` (int64), ``confidence`` (mean
    max probability) and ``accuracy`` (mean correctness); the two means are NaN in empty
    bins so a plotter can skip them. sum_b count_b |accuracy_b - confidence_b| / n is ECE.
    """
    n_bins = _check_n_bins(n_bins)
    q, y = _validated(probs, labels)
    confidence, correct = _confidence_correct(q, y)
    edges, bins = _equal_width_bins(confidence, n_bins)
    counts = np.bincount(bins, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.bincount(bins, weights=confidence, minlength=n_bins) / counts
        mean_acc = np.bincount(bins, weights=correct, minlength=n_bins) / counts
    return {"edges": edges, "count": counts.astype(np.int64), "confidence": mean_conf,
            "accuracy": mean_acc}


def evaluate(probs, labels, reference=None, threshold: float | None = None) -> dict[str, float]:
    """Every scalar metric of one probability report, keyed as in MLflow's ``{report}.{metric}``.

    Keys: ece, ece_em, smece, nll, brier, accuracy, tpcr; tpcr is measured against
    ``reference`` (the original classifier's probabilities) or 0.0 when it is None.
    With a binary decision ``threshold``, accuracy and tpcr are of the decisions at it
    (the confidence metrics stay on the top-1 probability).
    """
    q, y = _validated(probs, labels)
    return {
        "ece": ece(q, y),
        "ece_em": ece_em(q, y),
        "smece": smece(q, y),
        "nll": nll(q, y),
        "brier": brier(q, y),
        "accuracy": accuracy(q, y, threshold),
        "tpcr": 0.0 if reference is None else tpcr(reference, q, threshold),
    }


#: A row counts as moved by the repair when some entry moved by more than this, and as
#: on the decision boundary when its top-1 leads the runner-up by at most this: far below
#: any calibration signal (a reliability bin is 1/15 wide), far above float64 rounding,
#: and above the float32 graph's nudges (a few ulps of 1/2), so the graph's outputs and
#: cord_ops' count alike.
REPAIR_ATOL = 1e-6
#: The summary warns when more than this share of the outputs were repaired to one value.
FLAT_WARNING_SHARE = 0.01


def repair_effect(original, calibrated, repaired, labels=None,
                  threshold: float | None = None) -> dict[str, float]:
    """What the CORD repair did to a calibrator's outputs, keyed as MLflow's
    ``cord.{key}``:

    - ``moved_share``: rows where some entry of ``repaired`` differs from ``calibrated``
      by more than :data:`REPAIR_ATOL`;
    - ``boundary_share``: rows the repair moved whose repaired top-1 leads the runner-up
      by at most REPAIR_ATOL: pinned onto the decision boundary (a binary row whose
      calibrated decision flipped gets exactly min I = 1/2 + EPS_NUM, eq. 4); with a
      binary ``threshold`` t, measured in the reweighted space whose argmax is the
      decision at t (:mod:`cord_ops.threshold`), i.e. p1 pinned next to t;
    - ``flat_share`` and ``flat_value``: the one repaired top-1 probability the most moved
      rows share exactly, among values the repair gave to rows whose calibrated
      probabilities differed, and the share of all rows holding it (0.0 and NaN when
      there is none): the outputs the repair made one constant, which a ranking metric, a
      reliability bin or a threshold-based monitor then sees as a tie. Rows a tree model
      already gave one value (its leaves) and the repair moved alike are not counted;
    - for K = 2 with both classes in ``labels``: ``auc_uncal``, ``auc_base``,
      ``auc_cord``, the ROC AUC of the positive-class column of each report (ties count
      one half), the ranking the repair's constant can cost.

    Shares are over all n rows of the split.
    """
    p0 = check_probabilities(original, "original")
    q = check_probabilities(calibrated, "calibrated")
    r = check_probabilities(repaired, "repaired")
    check_pair(p0, q, ("original", "calibrated"))
    check_pair(p0, r, ("original", "repaired"))
    n = r.shape[0]
    moved = np.abs(r - q).max(axis=1) > REPAIR_ATOL
    ranked = np.sort(to_decision_space(r, threshold), axis=1)
    on_boundary = moved & (ranked[:, -1] - ranked[:, -2] <= REPAIR_ATOL)
    top = r.max(axis=1)
    values, group, counts = np.unique(top[moved], return_inverse=True, return_counts=True)
    # how many distinct calibrated values (of the repaired top-1 class) each group gathers
    rows = np.flatnonzero(moved)
    before = q[rows, np.argmax(r[rows], axis=1)]
    pairs = np.unique(np.column_stack([group, before]), axis=0)
    gathered = np.bincount(pairs[:, 0].astype(np.int64), minlength=values.size)
    collapsed = np.where(gathered > 1, counts, 0)
    flat = int(np.argmax(collapsed)) if collapsed.size else None
    shared = flat is not None and collapsed[flat] > 1
    out = {"moved_share": float(moved.mean()),
           "boundary_share": float(on_boundary.mean()),
           "flat_share": float(counts[flat] / n) if shared else 0.0,
           "flat_value": float(values[flat]) if shared else float("nan")}
    if labels is not None and r.shape[1] == 2:
        y = check_labels(labels, n, 2)
        if 0 < y.sum() < n:
            from sklearn.metrics import roc_auc_score  # here: scikit-learn takes a while

            for name, probs in (("uncal", p0), ("base", q), ("cord", r)):
                out[f"auc_{name}"] = float(roc_auc_score(y, probs[:, 1]))
    return out


def flat_warning(effect: dict[str, float], threshold: float | None = None) -> str | None:
    """The summary's warning when the repair set more than FLAT_WARNING_SHARE of the
    outputs to one value (:func:`repair_effect`), else None. What it suggests depends on
    the decision kept: a top-1-preserving map never needs the repair of the argmax, while
    at a ``threshold`` other than 1/2 even a monotone map can move p1 across it."""
    share = effect.get("flat_share", 0.0)
    if not share > FLAT_WARNING_SHARE:
        return None
    advice = ("a top-1-preserving calibrator (ts, irm) never needs the repair"
              if threshold is None or threshold == 0.5 else
              "a monotone map (ts) keeps the ranking and needs the repair less")
    return (f"FlatRepairWarning: CORD repaired {share:.1%} of the outputs to one value "
            f"({effect['flat_value']!r}): they keep their decision but tie with each other "
            f"(a ranking, a reliability bin or a monitor's threshold sees one point); {advice}")
