"""Synthetic miscalibrated data for the calibrator tests (fresh clones have no shared data)."""

from __future__ import annotations

import pytest
from calibrators.synthetic import miscalibrated


@pytest.fixture(scope="session")
def synthetic():
    """(cal_logits, cal_labels, eval_logits, eval_labels), K = 4."""
    z, y = miscalibrated(0, 3000, 4)
    return z[:1500], y[:1500], z[1500:], y[1500:]


@pytest.fixture(scope="session")
def make_miscalibrated():
    """The generator itself, for tests that need another size."""
    return miscalibrated
