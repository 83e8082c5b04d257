"""cord_ops: the numerics of CORD (prediction-preserving post-fit repair), calibrators,
metrics and data loading. Pure numpy/scipy/scikit-learn."""

__all__ = ["CORD", "CORDCalibratedClassifier", "minimal_repair"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # Loaded on first use (PEP 562) so that importing a light submodule such as
    # ``cord_ops.names`` does not pull in numpy and scikit-learn.
    if name == "CORDCalibratedClassifier":
        from cord_ops import calibrated

        return calibrated.CORDCalibratedClassifier
    if name in __all__:
        from cord_ops import cord

        return getattr(cord, name)
    raise AttributeError(f"module 'cord_ops' has no attribute {name!r}")
