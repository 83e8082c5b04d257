"""What one reproduction evaluates: the validated (file, calibrator, seed) cells.

The plan is fixed, and every input file loaded and checked, before any task or run exists,
so a bad file or option fails the command at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cord_ops import data
from flows.reproduce.defaults import (
    CALIBRATORS,
    DEFAULT_SEEDS,
    FIT_COST_ORDER,
    LOCAL_WEIGHTS,
    QUICK_CALIBRATORS,
    QUICK_FILES,
    SIZE_CALIBRATORS,
    SIZE_FRACTIONS,
    dataset_and_classifier,
)


@dataclass(frozen=True)
class SweepPlan:
    """What one reproduction evaluates (all fields plain, so the plan logs as params)."""

    files: tuple[str, ...]
    calibrators: tuple[str, ...]
    seeds: tuple[int, ...]
    size_calibrators: tuple[str, ...]
    size_fractions: tuple[float, ...]
    local_weights: tuple[float, ...]

    def cells(self) -> list[tuple[str, str, int]]:
        """(file, calibrator, seed) triples, the slowest fits first."""
        rank = {name: i for i, name in enumerate(FIT_COST_ORDER)}
        sizes = {path: Path(path).stat().st_size for path in self.files}
        return sorted(((f, c, s) for f in self.files for c in self.calibrators
                       for s in self.seeds),
                      key=lambda cell: (rank.get(cell[1], 0), -sizes[cell[0]], cell))


def plan_sweep(data_dir, *, seeds: int = DEFAULT_SEEDS, calibrators=None,
               quick: bool = False) -> SweepPlan:
    """Validate the inputs and fix what the sweep covers; raises before anything runs.

    Every .npz in ``data_dir`` is loaded and validated here (so a bad file fails the
    command before any task or run exists). ``quick`` keeps 1 seed, 2 files (one per
    dataset where there are several) and 3 calibrators (vs, svs, irova) unless
    ``calibrators`` names others.
    """
    root = Path(data_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"--data: {root} is not a directory")
    files = sorted(str(p.resolve()) for p in root.glob("*.npz"))
    if not files:
        raise FileNotFoundError(f"--data: {root} holds no .npz files")
    chosen = tuple(calibrators) if calibrators else (QUICK_CALIBRATORS if quick else CALIBRATORS)
    unknown = [c for c in chosen if c not in CALIBRATORS]
    if unknown:
        raise ValueError(f"--calibrators: unknown {unknown}; expected names from {CALIBRATORS}")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"--calibrators: {list(chosen)} names a calibrator twice")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"--seeds: expected a positive number of splits, got {seeds!r}")
    if quick:
        seeds = 1
        files = _one_per_dataset(files)[:QUICK_FILES]
    for path in files:
        data.load_npz(path)
    return SweepPlan(files=tuple(files), calibrators=chosen, seeds=tuple(range(seeds)),
                     size_calibrators=tuple(c for c in chosen if c in SIZE_CALIBRATORS),
                     size_fractions=SIZE_FRACTIONS, local_weights=LOCAL_WEIGHTS)


def _one_per_dataset(files: list[str]) -> list[str]:
    """The files reordered so the first file of every dataset comes first."""
    firsts, rest, seen = [], [], set()
    for path in files:
        dataset = dataset_and_classifier(path)[0]
        (rest if dataset in seen else firsts).append(path)
        seen.add(dataset)
    return firsts + rest


def write_digits_data(folder: Path) -> Path:
    """Two classifiers' held-out logits on sklearn's bundled digits (``digits_a``: split seed
    0, ``digits_b``: seed 1), so ``--quick`` runs on a fresh clone without the shared data
    folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, seed in (("digits_a", 0), ("digits_b", 1)):
        bundled = data.digits_dataset(seed)
        data.save_npz(folder / f"{name}.npz", bundled.scores, bundled.labels, "logits")
    return folder
