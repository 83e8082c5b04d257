"""The warm runner's process: ``python -m flows.warm_main STATE_FOLDER FINGERPRINT``.

Started detached by ``cord-ops server start`` (:func:`flows.warm.spawn`). It lives apart
from :mod:`flows.warm` so that the runner can run the CLI's entry point while the CLI
imports :mod:`flows.warm` to hand commands over, without an import cycle.
"""

from __future__ import annotations

import sys
from pathlib import Path

from flows.cli import main as cli
from flows.runtime import warm

if __name__ == "__main__":
    warm.serve(Path(sys.argv[1]), sys.argv[2], cli.main)
