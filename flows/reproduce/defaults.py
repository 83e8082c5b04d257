"""What the reproduction covers unless told otherwise: the paper's protocol constants and
the command line's defaults.

Pure Python (no numpy), so building the ``cord-ops`` parser stays fast. Calibrator names
come from :mod:`cord_ops.names`, the one list the whole project reads.
"""

from __future__ import annotations

from pathlib import Path

from cord_ops.names import CALIBRATOR_NAMES, TOP1_PRESERVING

#: Every calibrator, in the paper's order.
CALIBRATORS = CALIBRATOR_NAMES
#: The seven maps that may change the top-1 prediction (the paper's "Base" set, whose
#: conditions enter Tables 1-3 and 6) and the fit-time preserving baselines of Table 4
#: (AdaTS needs penultimate features, which no logit file has).
NON_PRESERVING = tuple(name for name in CALIBRATOR_NAMES if name not in TOP1_PRESERVING)
FIT_TIME_BASELINES = TOP1_PRESERVING
#: Calibrators of the calibration-size study (the paper's ImageNet-1K set, Figure 4).
SIZE_CALIBRATORS = ("vs", "svs", "irova", "irova-ts")
SIZE_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
#: Appendix B's grid of local weights; 0.5 is CORD itself.
LOCAL_WEIGHTS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
MEAN_TARGET_VARIANTS = ("none", "local", "pointwise")

DEFAULT_SEEDS = 5
DEFAULT_WORKERS = 2
DEFAULT_OUT = Path("out") / "reproduce"
DEFAULT_BENCH_OUT = Path("out") / "bench"
EXPERIMENT = "cord-ops-reproduce"
BENCH_EXPERIMENT = "cord-ops-bench"

#: ``--quick``: one seed, two files (one per dataset first), three calibrators.
QUICK_CALIBRATORS = ("vs", "svs", "irova")
QUICK_FILES = 2
#: Cost order of one task, most expensive first (single-threaded fit times on CIFAR-100,
#: docs/reproduction.md: Dir-ODIR's cross-validated fit dwarfs the rest). Submitting the
#: slow tasks first keeps both workers busy to the end instead of leaving a long fit for last.
FIT_COST_ORDER = ("dir-odir", "ms", "mcct-i", "vs", "sms", "irova-ts", "irova", "svs",
                  "ts-tva", "irm", "ts")


def default_data_dir() -> Path | None:
    """The shared CIFAR logits folder (``shared/data`` beside the working directory or beside
    the repository), if present."""
    candidates = (Path.cwd().parent / "shared" / "data",
                  Path(__file__).resolve().parents[3] / "shared" / "data")
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    return None


def dataset_and_classifier(path) -> tuple[str, str]:
    """Split a file stem ``<dataset>_<classifier>`` (e.g. cifar10_resnet56) at its first
    underscore; a stem without one is a dataset of its own."""
    stem = Path(path).stem
    dataset, _, classifier = stem.partition("_")
    return dataset, classifier or stem
