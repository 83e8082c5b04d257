"""What a recalibration run records besides its metrics, as plain values: the run params of
the MLflow contract (docs/contract.md), the data provenance tags, the metrics table and the
SHA-256 digests that :func:`flows.recalibrate.store_steps.verify_artifacts` checks the
uploaded artifacts against (the manifest and its run tag: :mod:`flows.store.graphs`).

Nothing here talks to MLflow or Prefect.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from cord_ops import CORD, cord_kernels, data

REPORTS = ("uncal", "base", "cord")
METRICS = ("ece", "ece_em", "smece", "nll", "brier", "accuracy", "tpcr")


def run_params(calibrator: str, dataset: data.Dataset, n_calibration: int,
               n_evaluation: int, seed: int, repair: CORD) -> dict[str, str]:
    """The run params of the MLflow contract in docs/contract.md (floats as exact repr;
    ``decision_threshold`` only when the repair keeps a binary threshold's decisions)."""
    threshold = getattr(repair, "decision_threshold", None)
    return {
        **({} if threshold is None else {"decision_threshold": repr(float(threshold))}),
        "calibrator": calibrator,
        "n_classes": str(dataset.n_classes),
        "n_calibration": str(n_calibration),
        "n_evaluation": str(n_evaluation),
        "seed": str(seed),
        "input_kind": dataset.input_kind,
        "eps_num": repr(cord_kernels.EPS_NUM),
        "delta_stab": repr(cord_kernels.DELTA_STAB),
        "eta_star": repr(repair.eta_),
    }


def metrics_markdown(reports: dict[str, dict[str, float]], eta_star: float) -> str:
    """The metrics table as Markdown: one row per report, one column per metric."""
    lines = ["| report | " + " | ".join(METRICS) + " |",
             "|---|" + "---|" * len(METRICS)]
    for report in REPORTS:
        row = " | ".join(f"{reports[report][m]:.6f}" for m in METRICS)
        lines.append(f"| {report} | {row} |")
    lines.append("")
    lines.append(f"eta* = {eta_star!r}")
    return "\n".join(lines) + "\n"


def data_tags(prefix: str, dataset: data.Dataset) -> dict[str, str]:
    """Provenance tags of ``dataset`` under ``prefix`` (``data`` or ``eval_data``): its
    digest, shape, input kind and path, and what loading changed."""
    tags = {f"{prefix}.sha256": dataset.sha256,
            f"{prefix}.shape": f"{dataset.n}x{dataset.n_classes}",
            f"{prefix}.input_kind": dataset.input_kind,
            f"{prefix}.path": str(dataset.path)}
    # What loading did (data.Dataset; shard sets have no such fields): the stored width
    # and the worst probability row's |sum - 1| before it was renormalised.
    if hasattr(dataset, "sum_error"):
        tags[f"{prefix}.input_width"] = str(dataset.width)
        tags[f"{prefix}.sum_error"] = repr(dataset.sum_error)
        tags[f"{prefix}.sum_error_row"] = str(dataset.sum_error_row)
    return tags


def file_digests(root: Path) -> dict[str, str]:
    """SHA-256 of every file under ``root``, by POSIX path relative to it."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def check_digests(root: Path, expected: dict[str, str], where: str) -> None:
    """Raise ValueError naming the first file of ``expected`` (digest by path relative to
    ``root``) that is missing under ``root`` or whose bytes differ; ``where`` starts the
    message."""
    for path, digest in sorted(expected.items()):
        local = root / path
        if not local.is_file():
            raise ValueError(f"{where}: artifact {path} is missing after logging; "
                             "nothing registered")
        found = hashlib.sha256(local.read_bytes()).hexdigest()
        if found != digest:
            raise ValueError(f"{where}: artifact {path} differs from what was written "
                             f"(sha256 {found[:12]} != {digest[:12]}, {local.stat().st_size} "
                             "bytes); nothing registered")
