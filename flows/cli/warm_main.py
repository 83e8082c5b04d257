"""The warm runner's process: ``python -m flows.cli.warm_main STATE_FOLDER``, its fingerprint
in ``CORD_OPS_WARM_FINGERPRINT`` (:data:`flows.platform.warm.FINGERPRINT_ENV`).

Started detached by ``cord-ops server start`` (:func:`flows.platform.warm.spawn`). It lives
apart from :mod:`flows.platform.warm` so that the runner can run the CLI's entry point while
the CLI imports :mod:`flows.platform.warm` to hand commands over, without an import cycle.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from flows.cli import main as cli
from flows.platform import warm


def first_drawing() -> None:
    """A first drawing loads fonts and builds caches (most of a second); a child inherits
    them. Matplotlib and Agg start no threads."""
    import tempfile

    import numpy as np

    from flows.recalibrate import plots

    with tempfile.TemporaryDirectory(prefix="cord-ops-warm-") as folder:
        plots.reliability_png(np.array([[0.75, 0.25], [0.4, 0.6]]), np.array([0, 1]),
                              Path(folder) / "warm.png", title="warm-up")


if __name__ == "__main__":
    # Taken out of the environment: the commands' children adopt their own.
    expected = os.environ.pop(warm.FINGERPRINT_ENV)
    warm.serve(Path(sys.argv[1]), expected, cli.main, cli.build_parser(),
               warm_up=first_drawing)
