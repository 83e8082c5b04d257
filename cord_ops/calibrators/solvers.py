"""Optimisers the calibrators share with the partition drivers of ``cord_ops.reduce``:
damped Newton with Armijo backtracking (``newton``) and its dense-Hessian step
(``dense_newton_step``), and the one warning every iterative fit gives when it stops
before convergence (``warn_not_converged``).

A problem is any object with ``value_grad(theta)`` -> (loss, gradient, d) and, for the dense
step, ``hessian(d)``: ``_affine``'s penalised multinomial logistic map in memory, or
``reduce``'s one whose sums come from partitions.
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.linalg
from sklearn.exceptions import ConvergenceWarning


def warn_not_converged(name: str, detail: str) -> None:
    """One place for the early-stop warning, so every family words it the same way."""
    warnings.warn(
        f"{name}: optimiser stopped before convergence ({detail}); the returned map is the "
        "last iterate, not an optimum. Raise max_iter to fit further.",
        ConvergenceWarning,
        stacklevel=3,
    )


def dense_newton_step(problem, grad, d):
    """The Newton step ``-H^-1 grad`` with the dense Hessian ``problem.hessian(d)`` (``d``:
    what ``problem.value_grad`` returned beside the gradient), by Cholesky; for
    :func:`newton`."""
    h = problem.hessian(d)
    # Softmax's shift invariance leaves H singular for unpenalised maps; a tiny ridge keeps
    # the Cholesky factorisation defined without changing the step elsewhere.
    h[np.diag_indices_from(h)] += 1e-10 * (1.0 + np.max(np.diag(h)))
    return -scipy.linalg.solve(h, grad.ravel(), assume_a="pos").reshape(grad.shape)


def newton(problem, theta, max_iter, gtol, newton_step, rtol=1e-15):
    """Minimise ``problem`` from ``theta`` by Newton steps (``newton_step(problem, grad, d)``,
    e.g. :func:`dense_newton_step`) with an Armijo backtracking line search.

    ``problem.value_grad(theta)`` returns (loss, gradient, d), ``d`` being whatever the step
    needs besides the gradient. Stops when the largest gradient entry is <= ``gtol``, when
    the loss decrease is below ``rtol`` relative (float64 resolution), when the line search
    stalls or after ``max_iter`` steps. Returns (theta, loss, steps, converged, why).
    """
    loss, grad, d = problem.value_grad(theta)
    for it in range(1, max_iter + 1):
        if np.max(np.abs(grad)) <= gtol:
            return theta, loss, it - 1, True, "gradient below gtol"
        step = newton_step(problem, grad, d)
        slope = float(np.sum(grad * step))
        t = 1.0
        for _ in range(40):
            new_theta = theta + t * step
            new_loss, new_grad, new_d = problem.value_grad(new_theta)
            if new_loss <= loss + 1e-4 * t * slope:
                break
            t *= 0.5
        else:
            return theta, loss, it, np.max(np.abs(grad)) <= 10 * gtol, "line search stalled"
        converged_f = loss - new_loss <= rtol * max(1.0, abs(loss))
        theta, loss, grad, d = new_theta, new_loss, new_grad, new_d
        if converged_f:
            return theta, loss, it, True, "objective decrease at float64 resolution"
    done = np.max(np.abs(grad)) <= gtol
    return theta, loss, max_iter, done, "gradient below gtol" if done else "max_iter reached"
