"""Post-hoc multiclass calibrators (docs/calibrators.md): ``make_calibrator(name, **options)``
builds one by name, ``calibrator_from_dict(d)`` rebuilds a fitted one from ``to_dict()``.

Every calibrator is a scikit-learn estimator (``_base`` documents the contract a new one
follows) with ``name``, ``input_kind`` ("logits" or "probs"), ``fit(scores, labels)``
(returns self; checks the options, sets ``n_classes_`` and ``n_features_in_`` from the
width of ``scores`` and ``classes_`` from the labels), ``predict_proba(scores)`` (n x K
float64 rows on the simplex), ``predict`` and ``to_dict()``; each module documents its
predict path as a closed form over the parameters that ``to_dict()`` stores.
"""

from __future__ import annotations

from cord_ops.calibrators._base import PROB_FLOOR, Calibrator, ConvergenceWarning, NotFittedError
from cord_ops.calibrators.dirichlet import DirichletODIR
from cord_ops.calibrators.identity import IdentityCalibrator
from cord_ops.calibrators.isotonic import (
    IsotonicMultiClass,
    IsotonicOneVsRest,
    IsotonicOneVsRestTS,
)
from cord_ops.calibrators.matrix import MatrixScaling
from cord_ops.calibrators.monotonic import MonotoneCalibrationMCCTI
from cord_ops.calibrators.structured import StructuredMatrixScaling, StructuredVectorScaling
from cord_ops.calibrators.temperature import TemperatureScaling
from cord_ops.calibrators.topversusall import TemperatureScalingTvA
from cord_ops.calibrators.vector import VectorScaling
from cord_ops.names import CALIBRATOR_NAMES, FAMILY_NAMES, IDENTITY, TOP1_PRESERVING

_FAMILIES: dict[str, type[Calibrator]] = {
    cls.name: cls
    for cls in (
        TemperatureScaling,
        VectorScaling,
        MatrixScaling,
        StructuredVectorScaling,
        StructuredMatrixScaling,
        DirichletODIR,
        IsotonicOneVsRest,
        IsotonicOneVsRestTS,
        IsotonicMultiClass,
        TemperatureScalingTvA,
        MonotoneCalibrationMCCTI,
    )
}

if set(_FAMILIES) != set(CALIBRATOR_NAMES):
    raise ImportError(f"cord_ops.names.CALIBRATOR_NAMES {CALIBRATOR_NAMES} does not match the "
                      f"calibrator families {tuple(_FAMILIES)}")
#: The paper's families, in the paper's order (``cord_ops.names.CALIBRATOR_NAMES``).
CALIBRATORS: dict[str, type[Calibrator]] = {name: _FAMILIES[name] for name in CALIBRATOR_NAMES}
#: Everything ``make_calibrator`` builds: the families, then the identity map
#: (``cord_ops.names.FAMILY_NAMES``).
REGISTRY: dict[str, type[Calibrator]] = {**CALIBRATORS, IDENTITY: IdentityCalibrator}


def _lookup(name) -> type[Calibrator]:
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown calibrator {name!r}; expected one of {', '.join(FAMILY_NAMES)}"
        ) from None


def make_calibrator(name: str, **options) -> Calibrator:
    """A fresh, unfitted calibrator; ``options`` go to its constructor (``input_kind``,
    ``prob_floor`` and the family's own options, e.g. ``max_iter``).

    Unlike the constructor (which stores its arguments verbatim, as scikit-learn requires),
    the factory validates the options at once, so a bad one fails before any data is read.
    """
    calibrator = _lookup(name)(**options)
    calibrator.validate_options()
    return calibrator


def calibrator_from_dict(d: dict) -> Calibrator:
    """The fitted calibrator described by ``d`` (output of ``to_dict()``), giving
    bit-identical ``predict_proba``. Raises ValueError on an unknown name or bad state."""
    if not isinstance(d, dict) or "name" not in d:
        raise ValueError("calibrator state: expected a dict with a 'name' key")
    return _lookup(d["name"]).from_dict(d)


__all__ = [
    "CALIBRATORS",
    "CALIBRATOR_NAMES",
    "FAMILY_NAMES",
    "IDENTITY",
    "PROB_FLOOR",
    "REGISTRY",
    "TOP1_PRESERVING",
    "Calibrator",
    "ConvergenceWarning",
    "DirichletODIR",
    "IdentityCalibrator",
    "IsotonicMultiClass",
    "IsotonicOneVsRest",
    "IsotonicOneVsRestTS",
    "MatrixScaling",
    "MonotoneCalibrationMCCTI",
    "NotFittedError",
    "StructuredMatrixScaling",
    "StructuredVectorScaling",
    "TemperatureScaling",
    "TemperatureScalingTvA",
    "VectorScaling",
    "calibrator_from_dict",
    "make_calibrator",
]
