"""What every calibrator shares: input handling, the JSON state format and the scikit-learn
contract. The softmax closed form and the mean-NLL gradient are :mod:`cord_ops.softmax`'s,
the optimisers and their early-stop warning :mod:`cord_ops.calibrators.solvers`'.

Input kinds
-----------
``input_kind="logits"`` (default): scores are real n x K logits and are used as given.
``input_kind="probs"``: scores are probability rows (validated by
``cord_ops.validation.check_probabilities``) and the logits are their clipped logarithms
``log(max(p, prob_floor))``. The default floor is the project's one floor for
log-probabilities, ``cord_ops.metrics.PROB_FLOOR`` = float64 epsilon (2.2e-16, log =
-36.04), the floor the reported NLL clips at: a zero probability then costs the fit what
it costs the metric (at the identity map). Deviation: probmetrics floors at float32 tiny
(1.2e-38, log = -87.3) before its temperature and structured scaling; on real CIFAR
softmax outputs the two give the same evaluation NLL to 1e-10 (docs/calibrators.md). The
floor is stored in ``to_dict()`` and used identically at fit and predict time (states
saved with another floor keep theirs). Isotonic calibrators work on probabilities and
never take a log of their input (``prob_floor`` only matters for the temperature inside
``irova-ts``).

State
-----
``to_dict()`` returns plain JSON types only: ``name``, ``input_kind``, ``prob_floor``,
``n_classes``, ``options`` (the constructor arguments) and ``params`` (the fitted arrays as
nested lists of floats). Python floats are written by ``json`` with ``repr``, so the state
round-trips bit for bit and ``calibrator_from_dict`` reproduces ``predict_proba`` exactly.
``version`` (currently 2) is written with every state; version 2 added ``classes`` (the
labels of the K columns, JSON strings, numbers or booleans). A state without ``version`` is
read as version 1, whose classes are 0 .. K-1.

The scikit-learn estimator contract (what a new calibrator must do)
-------------------------------------------------------------------
Every calibrator is a ``BaseEstimator`` and ``ClassifierMixin`` over scores: ``fit(scores,
labels)`` learns a map from n x K scores to calibrated probabilities, ``predict_proba``
applies it and ``predict`` returns ``classes_[argmax]``. A subclass

1. sets ``name`` and lists its own constructor arguments in ``_options`` (the JSON state
   stores exactly these) and its fitted arrays in ``param_shapes``;
2. writes an ``__init__`` whose keyword arguments are ``input_kind``, ``prob_floor`` and
   its options, each stored verbatim under its own name (no conversion, no check): that
   is what makes ``get_params``, ``set_params`` and ``clone`` work;
3. declares how each option is checked in ``_option_checks`` (keyword arguments of
   ``check_option``: ``integer``, ``allow_zero``, ``any_sign``; ``None`` values are
   allowed only for names listed in ``_optional``) and overrides
   ``validate_options`` (calling ``super()``) only for checks that table cannot say;
4. implements ``_fit(x, labels)`` and ``_predict(x)`` on validated float64 arrays, with
   integer labels in [0, K).

``fit`` validates the options (so ``cal.max_iter = -5`` set after construction is refused
there, not silently used), then the scores and labels, and sets ``n_classes_`` and
``n_features_in_`` (both K), ``classes_`` and the fitted arrays. Labels are integers in
[0, K) (``classes_ = 0 .. K-1``, and a class may be absent from the calibration rows), or
any other orderable labels (strings, booleans) of which exactly K distinct values appear,
matched to the columns in sorted order as scikit-learn classifiers do.
"""

from __future__ import annotations

import functools
import numbers
import warnings

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from threadpoolctl import ThreadpoolController

from cord_ops.metrics import PROB_FLOOR
from cord_ops.names import INPUT_KINDS
from cord_ops.softmax import softmax
from cord_ops.validation import check_class_labels, check_probabilities, check_scores

__all__ = [
    "PROB_FLOOR",
    "Calibrator",
    "ConvergenceWarning",
    "NotFittedError",
]

#: Version of the JSON state ``to_dict`` writes (module docstring, "State").
STATE_VERSION = 2


@functools.cache
def _blas_controller() -> ThreadpoolController:
    """Fits run with one BLAS thread: L-BFGS-B's many small BLAS calls on K^2 + K = 10,100
    parameters run many times slower with OpenBLAS threads on a busy machine, and
    single-threaded products make every fit bit-reproducible whatever the thread count.
    The controller is built once because scanning the loaded libraries costs milliseconds."""
    return ThreadpoolController()


def _float_list(a: np.ndarray) -> list:
    return np.asarray(a, dtype=np.float64).tolist()


class Calibrator(ClassifierMixin, BaseEstimator):
    """Base class: option and input validation, input kinds, fitted-state checks, JSON
    (de)serialisation and the scikit-learn estimator contract (module docstring).

    Subclasses set ``name``, list their constructor arguments in ``_options``, how each is
    checked in ``_option_checks`` and their fitted arrays in ``param_shapes`` (shape
    templates in terms of K), and implement ``_fit(scores, labels)`` and
    ``_predict(scores)`` on validated float64 arrays.
    """

    name: str = ""
    _options: tuple[str, ...] = ()
    #: option -> keyword arguments of ``check_option`` (checked at fit, not in __init__).
    _option_checks: dict[str, dict] = {}
    #: options that may also be None.
    _optional: tuple[str, ...] = ()
    #: fitted parameter -> shape template: () scalar, ("K",) vector, ("K", "K") matrix,
    #: "*" any length, "knots" a list of {"x": [...], "y": [...]} (one or K of them).
    #: Public: the fitted arrays are the attributes ``<key>_`` (what the state stores and
    #: what an exporter reads).
    param_shapes: dict[str, object] = {}

    def __init__(self, input_kind: str = "logits", prob_floor: float = PROB_FLOOR):
        self.input_kind = input_kind
        self.prob_floor = prob_floor

    def validate_options(self) -> None:
        """Raise ValueError naming the first constructor argument that is not valid.

        Runs at the start of ``fit`` (and in ``make_calibrator`` and ``from_dict``), so
        values set after construction are checked too. Subclasses with checks that
        ``_option_checks`` cannot express override this and call ``super()`` first.
        """
        if not isinstance(self.input_kind, str) or self.input_kind not in INPUT_KINDS:
            raise ValueError(
                f"input_kind: expected one of {INPUT_KINDS}, got {self.input_kind!r}"
            )
        floor = self.prob_floor
        if not (isinstance(floor, numbers.Real) and not isinstance(floor, bool)
                and 0.0 < floor < 1.0):
            raise ValueError(f"prob_floor: expected a number in (0, 1), got {floor!r}")
        for key, spec in self._option_checks.items():
            value = getattr(self, key)
            if value is None and key in self._optional:
                continue
            check_option(key, value, **spec)

    # ------------------------------------------------------------------ public API
    def fit(self, scores, labels) -> Calibrator:
        """Fit on n x K scores and n labels; K is the width of ``scores``.

        Labels are integers in [0, K), or K distinct orderable values (strings, ...) matched
        to the columns in sorted order (module docstring). Options are validated first.
        """
        self.validate_options()
        x = self._check_input(scores, n_classes=None)
        classes, y = check_class_labels(labels, x.shape[0], x.shape[1])
        self.warnings_ = []
        with _blas_controller().limit(limits=1, user_api="blas"):
            self._fit(x, y)
        self.converged_ = not self.warnings_
        self.n_classes_ = x.shape[1]
        self.n_features_in_ = x.shape[1]
        self.classes_ = classes
        return self

    def predict_proba(self, scores) -> np.ndarray:
        """Calibrated n x K float64 probabilities (rows sum to 1 within 1e-12); column k is
        the probability of ``classes_[k]``."""
        self.check_is_fitted()
        x = self._check_input(scores, n_classes=self.n_classes_)
        return self._predict(x)

    def predict(self, scores) -> np.ndarray:
        """``classes_[argmax predict_proba]`` (smallest index on ties). Not necessarily the
        scores' own top-1: that is what CORD restores."""
        return self.classes_[np.argmax(self.predict_proba(scores), axis=1)]

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "n_classes_")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        # Probability rows are validated as such; logits may take any sign.
        tags.input_tags.positive_only = self.input_kind == "probs"
        return tags

    def to_dict(self) -> dict:
        """JSON-safe fitted state; see the module docstring for the layout."""
        self.check_is_fitted()
        params = {}
        for key, shape in self.param_shapes.items():
            value = getattr(self, key + "_")
            if shape == "knots":
                params[key] = [{"x": _float_list(kx), "y": _float_list(ky)} for kx, ky in value]
            elif shape == ():
                params[key] = float(value)
            else:
                params[key] = _float_list(value)
        return {
            "name": self.name,
            "version": STATE_VERSION,
            "input_kind": self.input_kind,
            "prob_floor": float(self.prob_floor),
            "n_classes": int(self.n_classes_),
            "classes": self.classes_.tolist(),
            "options": {key: _json_option(getattr(self, key)) for key in self._options},
            "params": params,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Calibrator:
        """Rebuild a fitted calibrator from ``to_dict()`` output; raises ValueError on a
        state that is not this calibrator's or whose arrays have the wrong shape."""
        if not isinstance(d, dict):
            raise ValueError(f"calibrator state: expected a dict, got {type(d).__name__}")
        missing = {"name", "input_kind", "prob_floor", "n_classes", "options", "params"} - set(d)
        if missing:
            raise ValueError(f"calibrator state: missing keys {sorted(missing)}")
        if d["name"] != cls.name:
            raise ValueError(f"calibrator state: name {d['name']!r} is not {cls.name!r}")
        version = d.get("version", 1)
        if version not in (1, STATE_VERSION):
            raise ValueError(
                f"calibrator state: expected version 1 or {STATE_VERSION}, got {version!r}"
            )
        k = d["n_classes"]
        if not isinstance(k, int) or isinstance(k, bool) or k < 2:
            raise ValueError(f"calibrator state: n_classes must be an integer >= 2, got {k!r}")
        options = d["options"]
        if not isinstance(options, dict) or set(options) != set(cls._options):
            raise ValueError(
                f"calibrator state: options must have exactly the keys {sorted(cls._options)}"
            )
        obj = cls(input_kind=d["input_kind"], prob_floor=d["prob_floor"], **options)
        obj.validate_options()
        classes = _load_classes(d.get("classes"), version, k)
        params = d["params"]
        if not isinstance(params, dict) or set(params) != set(cls.param_shapes):
            raise ValueError(
                f"calibrator state: params must have exactly the keys "
                f"{sorted(cls.param_shapes)}"
            )
        for key, shape in cls.param_shapes.items():
            setattr(obj, key + "_", _load_param(key, params[key], shape, k))
        obj.n_classes_ = k
        obj.n_features_in_ = k
        obj.classes_ = classes
        return obj

    # ------------------------------------------------------------------ helpers
    def _check_input(self, scores, n_classes: int | None) -> np.ndarray:
        if self.input_kind == "probs":
            return check_probabilities(scores, "scores", n_classes=n_classes)
        return check_scores(scores, "scores", n_classes=n_classes)

    def _warn(self, detail: str) -> None:
        """Record a fit that stopped early in ``warnings_`` (which flows read: ``converged_``
        is False when it is non-empty; neither is part of the saved state) and raise it as a
        ConvergenceWarning."""
        message = f"{self.name}: {detail}"
        self.warnings_.append(message)
        warnings.warn(message, ConvergenceWarning, stacklevel=4)

    def check_is_fitted(self) -> None:
        """Raise NotFittedError naming this calibrator unless it is fitted: the question
        scikit-learn's ``check_is_fitted`` asks of ``__sklearn_is_fitted__``, with a message
        that says how to fit one (for code that takes an already fitted calibrator)."""
        if not self.__sklearn_is_fitted__():
            raise NotFittedError(
                f"{self.name}: this calibrator is not fitted yet; call fit(scores, labels) "
                "or build it with calibrator_from_dict"
            )

    def _logits(self, x: np.ndarray) -> np.ndarray:
        """Logits of validated scores: the scores themselves, or log(max(p, prob_floor))."""
        if self.input_kind == "probs":
            return np.log(np.maximum(x, self.prob_floor))
        return x

    def _probs(self, x: np.ndarray) -> np.ndarray:
        """Probabilities of validated scores: softmax of logits, or the rows as given."""
        if self.input_kind == "probs":
            return x
        return softmax(x)

    def _fit(self, x: np.ndarray, y: np.ndarray) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _predict(self, x: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError


def check_option(name: str, value, *, integer: bool = False, allow_zero: bool = False,
                 any_sign: bool = False):
    """A constructor option that must be a finite positive number (or int); returns it.

    ``integer`` options must be integers (Python or numpy), not integral floats: options
    are used as stored (scikit-learn's contract), and ``range(2.0)`` would fail mid-fit.
    """
    kinds = numbers.Integral if integer else numbers.Real
    ok = isinstance(value, kinds) and not isinstance(value, bool) and np.isfinite(value)
    ok = ok and (any_sign or (value >= 0 if allow_zero else value > 0))
    if not ok:
        kind = "integer" if integer else "number"
        bound = "" if any_sign else ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name}: expected a finite {kind} {bound}, got {value!r}")
    return int(value) if integer else float(value)


def _json_option(value):
    if isinstance(value, tuple | list | np.ndarray):
        return [float(v) for v in value]
    if isinstance(value, np.generic):  # numpy scalars stored verbatim: JSON needs Python's
        return value.item()
    return value


def _load_classes(classes, version: int, k: int) -> np.ndarray:
    """The K column labels of a state: 0 .. K-1 for version 1, else the stored list."""
    if version == 1:
        return np.arange(k)
    if not isinstance(classes, list) or len(classes) != k:
        raise ValueError(f"calibrator state: classes must be a list of {k} labels")
    kinds = {type(c) for c in classes}
    if not (kinds <= {int} or kinds <= {float, int} or kinds <= {str} or kinds <= {bool}):
        raise ValueError("calibrator state: classes must be all numbers, all strings or "
                         f"all booleans, got types {sorted(t.__name__ for t in kinds)}")
    out = np.asarray(classes)
    if len(np.unique(out)) != k:
        raise ValueError("calibrator state: classes must be distinct")
    return out


def _load_param(key: str, value, shape, k: int):
    if shape == "knots":
        if not isinstance(value, list) or not value:
            raise ValueError(f"calibrator state: {key} must be a non-empty list of knot sets")
        knots = []
        for i, item in enumerate(value):
            if not isinstance(item, dict) or set(item) != {"x", "y"}:
                raise ValueError(f"calibrator state: {key}[{i}] must be a dict with x and y")
            kx = _finite_array(f"{key}[{i}].x", item["x"])
            ky = _finite_array(f"{key}[{i}].y", item["y"])
            if kx.ndim != 1 or kx.shape != ky.shape or kx.size == 0:
                raise ValueError(
                    f"calibrator state: {key}[{i}] x and y must be equal-length non-empty lists"
                )
            if np.any(np.diff(kx) <= 0):
                raise ValueError(f"calibrator state: {key}[{i}].x must be strictly increasing")
            knots.append((kx, ky))
        return knots
    arr = _finite_array(key, value)
    expected = tuple(k if s == "K" else s for s in shape)
    if arr.ndim != len(expected) or any(
        e != "*" and e != a for e, a in zip(expected, arr.shape, strict=True)
    ):
        raise ValueError(f"calibrator state: {key} must have shape {expected}, got {arr.shape}")
    return float(arr) if shape == () else arr


def _finite_array(key: str, value) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"calibrator state: {key} is not numeric ({exc})") from None
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"calibrator state: {key} contains NaN or inf")
    return arr

