"""Classifier outputs on disk: validated .npz loading, atomic saving, the paper's split, and a
bundled miscalibrated dataset (sklearn digits) for fresh clones and the demo.

An .npz file holds exactly one of ``logits`` or ``probs`` (n x K) and ``labels`` (n,). It is
read with ``allow_pickle=False``; every problem raises before anything is returned, with a
message that starts with the file path and names the array, the row and the expectation.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from scipy.special import softmax

from cord_ops.atomic import atomic_path
from cord_ops.names import INPUT_KINDS
from cord_ops.validation import (
    PROBABILITY_SUM_ATOL,
    check_labels,
    check_probabilities,
    check_scores,
)


@dataclass(frozen=True, eq=False)
class Dataset:
    """Classifier outputs and labels of one split.

    ``scores`` is a read-only float64 n x K array of logits or probabilities
    (``input_kind``), ``labels`` a read-only int64 (n,) array in [0, K). ``path`` is the
    source file (None for generated data) and ``sha256`` the hex digest of the source
    file's bytes, or for generated data of the float64 scores' bytes then the int64
    labels' bytes.
    """

    scores: np.ndarray
    labels: np.ndarray
    input_kind: str
    path: str | None
    sha256: str

    @property
    def n(self) -> int:
        return int(self.scores.shape[0])

    @property
    def n_classes(self) -> int:
        return int(self.scores.shape[1])

    def probabilities(self) -> np.ndarray:
        """The scores as probabilities: softmax of logits, or the stored probabilities."""
        if self.input_kind == "logits":
            return softmax(self.scores, axis=1)
        return self.scores.copy()


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.array(array, copy=True)
    array.setflags(write=False)
    return array


def _check_input_kind(input_kind: str, allowed: tuple[str, ...]) -> None:
    if input_kind not in allowed:
        raise ValueError(f"input_kind: expected one of {allowed}, got {input_kind!r}")


def _validated_arrays(scores, labels, input_kind: str, prefix: str):
    """Scores (float64) and labels (int64) checked for ``input_kind``; errors begin with prefix."""
    if input_kind == "probs":
        scores = check_probabilities(scores, f"{prefix}probs", atol=PROBABILITY_SUM_ATOL)
    else:
        scores = check_scores(scores, f"{prefix}logits")
    labels = check_labels(labels, scores.shape[0], scores.shape[1], f"{prefix}labels")
    return scores, labels


def _read_array(archive, key: str, where: str) -> np.ndarray:
    try:
        array = archive[key]
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise ValueError(
                f"{where}: array '{key}' is an object (pickled) array; expected a numeric "
                "array (files are read with allow_pickle=False)"
            ) from None
        raise ValueError(f"{where}: array '{key}' cannot be read ({exc})") from None
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{where}: array '{key}' is corrupt ({exc})") from None
    # NpzFile hands back raw bytes for a member without the .npy header
    if not isinstance(array, np.ndarray):
        raise ValueError(f"{where}: array '{key}' is corrupt (member is not in .npy format)")
    return array


def load_npz(path, *, input_kind: str = "auto") -> Dataset:
    """Load and validate classifier outputs from an .npz file.

    The file must hold ``labels`` and exactly one of ``logits`` / ``probs``; ``input_kind``
    "auto" takes whichever is present, "logits" or "probs" additionally requires that one.
    Logits must be finite; probabilities must also be non-negative with rows summing to 1
    within ``PROBABILITY_SUM_ATOL`` (1e-4). Labels must be integers (integer dtype, or
    floats with integral values) in [0, K), one per row. Scores come back as float64,
    labels as int64; the arrays are read-only.

    Raises FileNotFoundError for a missing file, TypeError for non-numeric arrays and
    ValueError for everything else, each message starting with the path.
    """
    _check_input_kind(input_kind, ("auto", *INPUT_KINDS))
    where = str(path)
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{where}: no such file") from None
    # numpy answers bytes that are neither .npz nor .npy with advice to enable pickle; say
    # what the file is not instead (a lone .npy array is reported below).
    if not raw.startswith(b"\x93NUMPY") and not zipfile.is_zipfile(io.BytesIO(raw)):
        raise ValueError(f"{where}: not an .npz archive (numpy.savez's zip of .npy arrays); "
                         "expected 'logits' or 'probs' and 'labels'")
    try:
        archive = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{where}: not a readable .npz archive ({exc})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"{where}: holds a single .npy array; expected an .npz archive with "
                         "'logits' or 'probs' and 'labels'")
    with archive:
        keys = set(archive.files)
        present = [kind for kind in INPUT_KINDS if kind in keys]
        if len(present) != 1:
            found = "both" if present else "neither"
            raise ValueError(f"{where}: holds {found} of 'logits' and 'probs' (arrays: "
                             f"{sorted(keys)}); expected exactly one")
        kind = present[0]
        if input_kind != "auto" and input_kind != kind:
            raise ValueError(f"{where}: input_kind={input_kind!r} but the file holds '{kind}'")
        if "labels" not in keys:
            raise ValueError(f"{where}: missing array 'labels' (arrays: {sorted(keys)})")
        scores = _read_array(archive, kind, where)
        labels = _read_array(archive, "labels", where)
    scores, labels = _validated_arrays(scores, labels, kind, f"{where}: ")
    return Dataset(_frozen(scores), _frozen(labels), kind, where,
                   hashlib.sha256(raw).hexdigest())


def save_npz(path, scores, labels, input_kind: str) -> Path:
    """Validate, then write ``{input_kind: scores, "labels": labels}`` to ``path`` atomically.

    The arrays are validated exactly as :func:`load_npz` would (so a saved file always
    loads) and stored as float64 / int64. The archive is written to a temporary file in the
    destination folder and moved into place with ``os.replace``: a failure leaves no partial
    file and an existing file either intact or wholly replaced. Returns the path.
    """
    _check_input_kind(input_kind, INPUT_KINDS)
    target = Path(path)
    scores, labels = _validated_arrays(scores, labels, input_kind, "")
    with atomic_path(target) as tmp, open(tmp, "wb") as handle:
        np.savez(handle, **{input_kind: scores, "labels": labels})
    return target


def split_indices(n: int, seed: int, fraction: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """The paper's split protocol: (calibration rows, evaluation rows).

    perm = np.random.default_rng(seed).permutation(n); the first round(fraction * n)
    entries of perm are the calibration rows and the rest the evaluation rows (Python's
    round, half to even). Deterministic in (n, seed, fraction); both parts are non-empty.
    """
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 2:
        raise ValueError(f"n: expected an integer >= 2 rows to split, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction: expected a calibration fraction in (0, 1), got {fraction!r}")
    n_cal = round(fraction * n)
    if not 0 < n_cal < n:
        raise ValueError(f"fraction: {fraction!r} of {n} rows leaves an empty split")
    perm = np.random.default_rng(seed).permutation(n)
    return perm[:n_cal], perm[n_cal:]


def split(dataset: Dataset, seed: int, fraction: float = 0.5) -> tuple[Dataset, Dataset]:
    """(calibration, evaluation) subsets of ``dataset`` by :func:`split_indices`.

    Both keep the source's ``input_kind``, ``path`` and ``sha256`` (provenance of the file).
    """
    cal_idx, eval_idx = split_indices(dataset.n, seed, fraction)
    return tuple(
        replace(dataset, scores=_frozen(dataset.scores[idx]), labels=_frozen(dataset.labels[idx]))
        for idx in (cal_idx, eval_idx)
    )


#: Inverse L2 strength of the digits classifier: regularisation is nearly off, so the
#: classifier fits its training half perfectly and its held-out logits are overconfident.
DIGITS_INVERSE_REGULARIZATION = 1e4


def digits_dataset(seed: int = 0) -> Dataset:
    """Held-out logits of a real, overconfident classifier on sklearn's bundled digits.

    sklearn's ``load_digits`` (1,797 8x8 images, K = 10, no network) is split with
    :func:`split_indices` (seed, fraction 0.5: 898 training rows); a multinomial
    ``LogisticRegression`` (lbfgs, C = 1e4, i.e. almost no L2 penalty, pixels scaled to
    [0, 1]) is trained on the first part and the other 899 rows' ``decision_function``
    values (pre-softmax logits) are returned with their labels. Training to separation
    without regularisation inflates the logits, so the softmax is overconfident (mean
    confidence 0.99 against accuracy 0.954, ECE 0.037 for seed 0): miscalibration for
    calibrators to fix. Deterministic in ``seed``; ``path`` is None.
    """
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    images, targets = load_digits(return_X_y=True)
    features = images / 16.0
    train_idx, held_idx = split_indices(targets.shape[0], seed)
    model = LogisticRegression(C=DIGITS_INVERSE_REGULARIZATION, max_iter=10_000)
    model.fit(features[train_idx], targets[train_idx])
    logits = model.decision_function(features[held_idx]).astype(np.float64)
    labels = targets[held_idx].astype(np.int64)
    digest = hashlib.sha256(logits.tobytes() + labels.tobytes()).hexdigest()
    return Dataset(_frozen(logits), _frozen(labels), "logits", None, digest)
