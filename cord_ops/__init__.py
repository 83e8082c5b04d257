"""cord_ops: the numerics of CORD (prediction-preserving post-fit repair), calibrators,
metrics and data loading. Pure numpy/scipy/scikit-learn."""

from cord_ops.calibrated import CORDCalibratedClassifier
from cord_ops.cord import CORD, minimal_repair

__all__ = ["CORD", "CORDCalibratedClassifier", "minimal_repair"]
__version__ = "0.1.0"
