"""``CORDCalibratedClassifier``: a classifier, a calibrator and the CORD repair as one
scikit-learn estimator, from the classifier's features to repaired probabilities.

It is the prediction-preserving counterpart of scikit-learn's
``CalibratedClassifierCV(FrozenEstimator(clf), ensemble=False)``: ``fit(X, y)`` on a
calibration set takes the classifier's scores on X (``decision_function`` logits, or
``predict_proba`` probabilities), fits a calibrator on them and then CORD on the pair
(original softmax, calibrated), so ``predict_proba`` is the repaired output of eq. 2 and
``predict`` is the classifier's own top-1 on every row (Proposition 1).

The classifier is never refitted unless ``cv`` asks for it:

- ``cv=None`` (default): ``estimator`` must already be fitted and is used as it is. Wrap it
  in ``sklearn.frozen.FrozenEstimator`` to keep it fitted through ``clone`` (which
  ``GridSearchCV`` and ``cross_val_predict`` call): cloning a plain fitted classifier gives
  an unfitted one, and ``fit`` then refuses it with a message that says so.
- ``cv=<int or splitter>``: the calibrator and CORD are fitted on out-of-fold scores
  (``cross_val_predict``) and the classifier is then refitted on all of X, as scikit-learn's
  ``ensemble=False``. This is what lets the estimator checks run on an unfitted classifier.

Binary classifiers whose ``decision_function`` returns one column d are given the logits
[0, d]: softmax([0, d]) = [1 - sigmoid(d), sigmoid(d)] is their ``predict_proba`` for
logistic models, and argmax [0, d] is 1 exactly when d > 0, which is their ``predict``.
"""

from __future__ import annotations

import numbers

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, MetaEstimatorMixin, clone
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import check_cv, cross_val_predict
from sklearn.utils import get_tags
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, column_or_1d

from cord_ops.calibrators import Calibrator, make_calibrator
from cord_ops.cord import CORD, check_cord_params
from cord_ops.names import AUTO, CALIBRATOR_CHOICES
from cord_ops.select import select_calibrator
from cord_ops.softmax import softmax
from cord_ops.validation import check_labels, check_probabilities, check_scores, top1

METHODS = ("auto", "decision_function", "predict_proba")
#: The input kind of the calibrator for each response method of the classifier.
INPUT_KIND = {"decision_function": "logits", "predict_proba": "probs"}


class CORDCalibratedClassifier(ClassifierMixin, MetaEstimatorMixin, BaseEstimator):
    """A fitted classifier recalibrated by ``calibrator`` and repaired by CORD.

    Parameters
    ----------
    estimator : classifier
        Fitted (``cv=None``; preferably wrapped in ``FrozenEstimator``), or unfitted with
        ``cv`` set. Must have ``classes_`` after fitting and ``decision_function`` or
        ``predict_proba``.
    calibrator : str or cord_ops calibrator, default="vs"
        A name from ``cord_ops.names.FAMILY_NAMES`` (the families and ``identity``),
        ``"auto"`` (the family chosen by 5-fold cross-validation on the calibration rows,
        identity included: ``cord_ops.select``; the decision is ``selection_``), or an
        unfitted calibrator (cloned; its ``input_kind`` is set from ``method``).
        Searchable by ``GridSearchCV`` like any parameter, and ``calibrator__<option>``
        when an instance is given.
    method : {"auto", "decision_function", "predict_proba"}, default="auto"
        The classifier's response used as scores: "auto" takes ``decision_function`` when
        the classifier has it (logits, what the parametric calibrators are defined on),
        else ``predict_proba``.
    cv : None, int or cross-validation splitter, default=None
        None: use ``estimator`` as fitted. Otherwise out-of-fold scores then a refit on all
        rows (module docstring).
    mean_target, local_weight :
        CORD's parameters (``cord_ops.CORD``).

    Attributes
    ----------
    estimator_ : the classifier used at predict time
    calibrator_ : the fitted calibrator
    selection_ : ``cord_ops.select.Selection`` when ``calibrator="auto"``, else None
    cord_ : the fitted ``CORD``
    classes_ : ndarray, the classifier's ``classes_`` (any label type)
    method_ : str, the response method used
    n_features_in_ : int, the classifier's (when it has one)
    """

    def __init__(self, estimator, calibrator="vs", *, method="auto", cv=None,
                 mean_target="inherited", local_weight=0.5):
        self.estimator = estimator
        self.calibrator = calibrator
        self.method = method
        self.cv = cv
        self.mean_target = mean_target
        self.local_weight = local_weight

    # ------------------------------------------------------------------ fitting
    def _validate_params(self) -> None:
        if not isinstance(self.method, str) or self.method not in METHODS:
            raise ValueError(f"method: expected one of {METHODS}, got {self.method!r}")
        if isinstance(self.calibrator, str):
            if self.calibrator not in CALIBRATOR_CHOICES:
                raise ValueError(f"calibrator: unknown calibrator {self.calibrator!r}; "
                                 f"expected one of {', '.join(CALIBRATOR_CHOICES)}")
        elif not isinstance(self.calibrator, Calibrator):
            raise ValueError("calibrator: expected a calibrator name or a cord_ops "
                             f"calibrator, got {type(self.calibrator).__name__}")
        cv = self.cv
        if cv is not None and not hasattr(cv, "split") and not (
                isinstance(cv, numbers.Integral) and not isinstance(cv, bool) and cv >= 2):
            raise ValueError(f"cv: expected None, an integer >= 2 or a splitter, got {cv!r}")
        # CORD checks its own parameters in fit; checking here fails before any fit runs.
        check_cord_params(CORD(mean_target=self.mean_target, local_weight=self.local_weight))

    def _resolve_method(self, estimator) -> str:
        if self.method != "auto":
            if not hasattr(estimator, self.method):
                raise ValueError(f"method: {type(estimator).__name__} has no {self.method}")
            return self.method
        for name in ("decision_function", "predict_proba"):
            if hasattr(estimator, name):
                return name
        raise ValueError(f"estimator: {type(estimator).__name__} has neither "
                         "decision_function nor predict_proba")

    def fit(self, X, y):
        """Fit the calibrator and CORD on the classifier's scores for (X, y).

        y holds labels from the classifier's ``classes_``; a label it does not know is
        refused with its row. Returns self.
        """
        self._validate_params()
        y = column_or_1d(y, warn=True)
        check_classification_targets(y)
        if self.cv is None:
            estimator = self.estimator
            try:
                check_is_fitted(estimator)
            except NotFittedError:
                raise NotFittedError(
                    f"estimator: {type(estimator).__name__} is not fitted. With cv=None the "
                    "classifier is used as fitted and never refitted: fit it first and wrap "
                    "it in sklearn.frozen.FrozenEstimator so clone() (GridSearchCV, "
                    "cross_val_predict) keeps it fitted, or set cv to fit it here"
                ) from None
            method = self._resolve_method(estimator)
            raw = getattr(estimator, method)(X)
        else:
            method = self._resolve_method(self.estimator)
            cv = check_cv(self.cv, y, classifier=True)
            raw = cross_val_predict(clone(self.estimator), X, y, cv=cv, method=method)
            estimator = clone(self.estimator).fit(X, y)

        self.estimator_ = estimator
        self.classes_ = np.asarray(estimator.classes_)
        self.method_ = method
        codes = self._encode(y)
        scores = self._as_scores(raw, method)
        kind = INPUT_KIND[method]
        self.selection_ = None
        if isinstance(self.calibrator, str) and self.calibrator == AUTO:
            self.selection_ = select_calibrator(scores, codes, kind)
            calibrator = make_calibrator(self.selection_.chosen, input_kind=kind)
        elif isinstance(self.calibrator, str):
            calibrator = make_calibrator(self.calibrator, input_kind=kind)
        else:
            calibrator = clone(self.calibrator).set_params(input_kind=kind)
        calibrator.fit(scores, codes)
        original = softmax(scores) if kind == "logits" else scores
        self.cord_ = CORD(mean_target=self.mean_target, local_weight=self.local_weight).fit(
            original, calibrator.predict_proba(scores))
        self.calibrator_ = calibrator
        if hasattr(estimator, "n_features_in_"):
            self.n_features_in_ = estimator.n_features_in_
        if hasattr(estimator, "feature_names_in_"):
            self.feature_names_in_ = estimator.feature_names_in_
        self._check_top1_is_predict(X, scores if self.cv is None else None)
        return self

    def _encode(self, y) -> np.ndarray:
        """Each label's column in ``classes_``; a label outside it is refused by row.

        Integer labels for a classifier with non-numeric classes are taken as column
        indices in [0, K): that is how ``cross_val_predict(method="predict_proba")`` hands
        labels on (it encodes them with a LabelEncoder, whose order is ``classes_``'), and
        an integer can never be one of such a classifier's labels.
        """
        classes = self.classes_
        y = np.asarray(y)
        if classes.dtype.kind not in "iufb" and y.dtype.kind in "iu":
            return check_labels(y, y.shape[0], len(classes), "y")
        order = np.argsort(classes, kind="stable")
        ranked = classes[order]
        try:
            pos = np.clip(np.searchsorted(ranked, y), 0, len(classes) - 1)
            unknown = np.asarray(ranked[pos] != y, dtype=bool)
        except TypeError:  # labels of a type that cannot be compared with classes_
            pos, unknown = None, np.ones(len(y), dtype=bool)
        if np.any(unknown):
            row = int(np.flatnonzero(unknown)[0])
            value = y[row].item() if isinstance(y[row], np.generic) else y[row]
            raise ValueError(f"y: row {row} is {value!r}, not one of the classifier's "
                             f"classes_ {classes.tolist()}")
        return order[pos]

    def _as_scores(self, raw, method: str) -> np.ndarray:
        """The classifier's response as validated n x K float64 scores (module docstring)."""
        name = f"{type(self.estimator_).__name__}.{method}"
        raw = np.asarray(raw)
        k = len(self.classes_)
        if method == "decision_function" and raw.ndim == 1 and k == 2:
            d = check_scores(raw[:, None].repeat(2, axis=1), name)[:, 1]
            scores = np.zeros((d.shape[0], 2))
            scores[:, 1] = d
            return scores
        check = check_scores if method == "decision_function" else check_probabilities
        return check(raw, name, n_classes=k)

    def _check_top1_is_predict(self, X, scores) -> None:
        """The guarantee predict == estimator.predict rests on the classifier predicting
        the argmax of its scores; a classifier that does not is refused with its row."""
        if scores is None:
            scores = self._as_scores(getattr(self.estimator_, self.method_)(X), self.method_)
        own = np.asarray(self.estimator_.predict(X))
        ours = self.classes_[top1(scores)]
        differ = own != ours
        if np.any(differ):
            row = int(np.flatnonzero(differ)[0])
            raise ValueError(
                f"estimator: row {row}: {type(self.estimator_).__name__}.predict gives "
                f"{own[row].item()!r} but the argmax of its {self.method_} gives "
                f"{ours[row].item()!r}; "
                "CORD keeps the latter, so use the method whose argmax is the prediction"
            )

    # ------------------------------------------------------------------ prediction
    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "cord_")

    def _outputs(self, X) -> tuple[np.ndarray, np.ndarray]:
        check_is_fitted(self)
        scores = self._as_scores(getattr(self.estimator_, self.method_)(X), self.method_)
        original = softmax(scores) if self.method_ == "decision_function" else scores
        return original, self.calibrator_.predict_proba(scores)

    def predict_proba(self, X) -> np.ndarray:
        """Repaired probabilities, n x K float64; column k belongs to ``classes_[k]``."""
        original, calibrated = self._outputs(X)
        return self.cord_.transform(original, calibrated)

    def predict(self, X) -> np.ndarray:
        """``classes_[argmax predict_proba]``: the classifier's own prediction on every
        row, because CORD keeps the original top-1 strictly on top."""
        repaired = self.predict_proba(X)
        return self.classes_[top1(repaired)]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        inner = get_tags(self.estimator)
        tags.input_tags.sparse = inner.input_tags.sparse
        tags.input_tags.allow_nan = inner.input_tags.allow_nan
        tags.input_tags.categorical = inner.input_tags.categorical
        tags.input_tags.string = inner.input_tags.string
        return tags
