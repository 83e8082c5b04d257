"""The row softmax, the closed form every calibrator's predict path ends with, and the mean
NLL of a softmax with its gradient (what the affine and Dirichlet fits minimise). The one
softmax of the project: the calibrators, a classifier's original probabilities
(``cord_ops.calibrated``, ``cord_ops.data``), the partition drivers of ``cord_ops.reduce``,
the parity check of ``onnx_export`` and serving's probe batch all call it, so one input
gives one set of probabilities everywhere.
"""

from __future__ import annotations

import numpy as np


def softmax(s: np.ndarray, overwrite: bool = False) -> np.ndarray:
    """Row softmax ``exp(s - max_k s) / sum_k exp(s - max_k s)`` in float64.

    This is the closed form every predict path ends with; subtracting the row maximum keeps
    ``exp`` in (0, 1], so no row overflows and the largest entry never underflows.
    ``overwrite=True`` computes it in ``s`` itself (for a temporary the caller owns), else
    in one new array; either way the values are the same bit for bit.
    """
    # The row maximum gathered at the row's argmax: the same value as s.max(axis=1), several
    # times faster for short rows.
    top = s[np.arange(s.shape[0]), s.argmax(axis=1)][:, None]
    e = np.subtract(s, top, out=s if overwrite else None)
    np.exp(e, out=e)
    e /= e.sum(axis=1, keepdims=True)
    return e


def mean_nll_and_grad(s: np.ndarray, labels: np.ndarray,
                      overwrite: bool = False) -> tuple[float, np.ndarray]:
    """Mean NLL of ``softmax(s)`` and its gradient ``(softmax(s) - onehot) / n`` w.r.t. ``s``.

    The log-probability of the label is taken from the log-sum-exp form, never from
    ``log(softmax)``, so it stays finite however small the probability. ``overwrite=True``
    builds the gradient in ``s`` itself (a temporary the caller owns): one n x K array
    fewer at the peak, the same values.
    """
    n = s.shape[0]
    rows = np.arange(n)
    picked = s[rows, labels]
    m = s.max(axis=1)
    e = np.subtract(s, m[:, None], out=s if overwrite else None)
    np.exp(e, out=e)
    total = e.sum(axis=1)
    nll = float(np.mean(np.log(total) + m - picked))
    e *= (1.0 / (n * total))[:, None]
    e[rows, labels] -= 1.0 / n
    return nll, e
