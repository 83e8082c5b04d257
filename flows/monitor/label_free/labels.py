"""Labels that arrive on their own (``cord-ops monitor --data BATCH --labels LABELS``): a
file holding only the labels and a row key, matched to a batch an earlier label-free run
logged.

``LABELS`` is an .npz with the arrays ``labels`` and ``row_id`` or a Parquet file with those
columns (others ignored). A row's key is the batch's own ``row_id`` (array or column) when
it has one, else its position 0..n-1. Every batch row needs exactly one label: a key set
with a repeated key, a missing row, a key that is not the batch's, or a label outside
[0, K) for the champion's K is refused with one line naming the file, the array and the
row, before anything is written. The joined batch then meets its earlier estimates as a
labelled one does (:func:`flows.monitor.label_free.records.meet_labels`): realised accuracy
and calibration, and the estimation errors, on every finished label-free run whose scores
digest is the batch's.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
from prefect import flow

from cord_ops import data, read_budget
from flows.monitor.label_free import records
from flows.monitor.label_free.flow import settle
from flows.store import tracking

KEY = "row_id"
LABELS = "labels"


def _read_columns(path: Path, names: tuple[str, ...], required: tuple[str, ...]) -> dict:
    """The 1-D arrays ``names`` of an .npz or Parquet file (ValueError naming the file
    when one of ``required`` is missing or unreadable)."""
    if data.is_parquet(path):
        table = data.read_parquet_table(path)
        found = {n: table.column(n).to_numpy(zero_copy_only=False)
                 for n in names if n in table.column_names}
        kind = "column"
    else:
        read_budget.check_npz(path)
        try:
            archive = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a readable .npz archive ({exc})") from None
        with archive:
            try:
                found = {n: archive[n] for n in names if n in archive.files}
            except ValueError:
                raise ValueError(f"{path}: an array cannot be read without pickle") from None
        kind = "array"
    for name in required:
        if name not in found:
            raise ValueError(f"{path}: expected {'a' if kind == 'column' else 'an'} {kind} "
                             f"'{name}' (a labels-only file holds '{LABELS}' and '{KEY}')")
    for name, values in found.items():
        if values.ndim != 1:
            raise ValueError(f"{path}['{name}']: expected one value per row, got shape "
                             f"{values.shape}")
        if name != KEY:  # the caller checks the labels' dtype
            continue
        if values.dtype.kind not in "iuUSO" or (values.dtype.kind == "O" and not all(
                isinstance(v, str) for v in values)):
            raise TypeError(f"{path}['{name}']: expected integers or strings, got dtype "
                            f"{values.dtype}")
        if values.dtype.kind in "SO":  # Parquet strings come as objects: one kind to compare
            found[name] = values.astype(str)
    return found


def _show(key) -> str:
    """A key as the operator wrote it (``4``, ``'tx-1'``), not numpy's repr."""
    return repr(key.item() if isinstance(key, np.generic) else key)


def _first_repeat(keys: np.ndarray) -> tuple[int, int] | None:
    """(row, first row) of the first key that repeats an earlier one, or None."""
    _, first, counts = np.unique(keys, return_index=True, return_counts=True)
    if counts.max(initial=1) <= 1:
        return None
    seen = np.zeros(len(keys), dtype=bool)
    seen[first] = True
    row = int(np.flatnonzero(~seen)[0])
    return row, int(np.flatnonzero(keys == keys[row])[0])


def batch_keys(path, n: int) -> np.ndarray:
    """The batch's row keys: its ``row_id`` when it has one (unique), else 0..n-1."""
    found = _read_columns(Path(path), (KEY,), ())
    if KEY not in found:
        return np.arange(n)
    keys = found[KEY]
    if len(keys) != n:
        raise ValueError(f"{path}['{KEY}']: {len(keys)} keys for {n} rows")
    repeat = _first_repeat(keys)
    if repeat is not None:
        raise ValueError(f"{path}['{KEY}']: row {repeat[0]} repeats key {_show(keys[repeat[0]])} "
                         f"of row {repeat[1]}")
    return keys


def join_labels(labels_path, batch_path, keys: np.ndarray, n_classes: int) -> np.ndarray:
    """The labels of ``labels_path`` in the order of the batch rows whose keys are ``keys``;
    ValueError/TypeError naming the file, array and row on any other key set."""
    path = Path(labels_path)
    found = _read_columns(path, (LABELS, KEY), (LABELS, KEY))
    labels, theirs = found[LABELS], found[KEY]
    if labels.dtype.kind not in "iu":
        raise TypeError(f"{path}['{LABELS}']: expected integer class indices, got dtype "
                        f"{labels.dtype}")
    if len(labels) != len(theirs):
        raise ValueError(f"{path}: {len(labels)} labels but {len(theirs)} row keys")
    if len(labels) == 0:
        raise ValueError(f"{path}['{LABELS}']: holds no rows; expected one label for each of "
                         f"the {len(keys)} rows of {batch_path}")
    bad = np.flatnonzero((labels < 0) | (labels >= n_classes))
    if bad.size:
        raise ValueError(f"{path}['{LABELS}']: row {bad[0]} is {labels[bad[0]]}, expected a "
                         f"class in [0, {n_classes}) (the champion has {n_classes} classes)")
    repeat = _first_repeat(theirs)
    if repeat is not None:
        raise ValueError(f"{path}['{KEY}']: row {repeat[0]} repeats key "
                         f"{_show(theirs[repeat[0]])} of row {repeat[1]}")
    if theirs.dtype.kind != keys.dtype.kind and {theirs.dtype.kind, keys.dtype.kind} != {"i", "u"}:
        raise TypeError(f"{path}['{KEY}']: keys of dtype {theirs.dtype}, but the rows of "
                        f"{batch_path} are keyed by {keys.dtype}")
    order = np.argsort(theirs, kind="stable")
    at = np.searchsorted(theirs[order], keys)
    at = np.minimum(at, len(order) - 1)
    matched = theirs[order][at] == keys
    if not matched.all():
        row = int(np.flatnonzero(~matched)[0])
        raise ValueError(f"{path}['{KEY}']: no label for {int((~matched).sum())} of the "
                         f"{len(keys)} rows of {batch_path} (first: row {row}, key "
                         f"{_show(keys[row])})")
    if len(theirs) != len(keys):  # every batch key matched once, so some keys are others'
        used = np.zeros(len(theirs), dtype=bool)
        used[order[at]] = True
        row = int(np.flatnonzero(~used)[0])
        raise ValueError(f"{path}['{KEY}']: row {row} has key {_show(theirs[row])}, which "
                         f"is not a row of {batch_path}")
    return np.asarray(labels[order[at]], dtype=np.int64)


def labelled_batch(batch_path, labels_path, n_classes: int, input_kind: str) -> records.Batch:
    """The batch of ``batch_path`` with the labels of ``labels_path`` joined by row key; its
    path is the labels file's (the tag ``monitor.labels_run`` says where labels came from)."""
    batch = records.read_batch(batch_path, n_classes, input_kind)
    if batch.labels is not None:
        raise ValueError(f"{batch_path}: already holds labels; give it without --labels")
    labels = join_labels(labels_path, batch_path, batch_keys(batch_path, batch.n), n_classes)
    return replace(batch, path=str(labels_path), labels=labels)


def earlier_runs(client, model_name: str, batch: records.Batch) -> list:
    """The finished label-free runs of ``model_name`` that logged ``batch``'s scores."""
    experiment = client.get_experiment_by_name(records.monitoring_experiment(model_name))
    if experiment is None:
        return []
    return client.search_runs([experiment.experiment_id],
                              f"tags.`{records.SCORES_DIGEST_TAG}` = "
                              f"'{batch.scores_sha256}' and tags.`cord.kind` = "
                              f"'{records.KIND}' and attributes.status = 'FINISHED'")


def check(uri: str, model_name: str, batch_path, labels_path, n_classes: int,
          input_kind: str) -> records.Batch:
    """:func:`labelled_batch`, and at least one earlier label-free run of it (ValueError)."""
    batch = labelled_batch(batch_path, labels_path, n_classes, input_kind)
    if not earlier_runs(tracking.client(uri), model_name, batch):
        raise ValueError(f"{batch_path}: no finished label-free run of '{model_name}' logged "
                         "these scores; monitor it first (cord-ops monitor --data BATCH)")
    return batch


@flow(name="monitor-labels-arrive", persist_result=False)
def meet_labels_file(data: str, labels: str, model_name: str = "cord-ops",
                     tracking_uri: str | None = None) -> dict[str, dict[str, float]]:
    """Join ``labels`` (a labels-only file) to the batch ``data`` and log the realised
    metrics and estimation errors on its earlier label-free runs; returns them by run id."""
    from flows import inputs
    from flows.store import registry

    uri = tracking.store_uri(tracking_uri)
    reads = inputs.model_reads(uri, f"models:/{model_name}@{registry.CHAMPION}")
    if reads is None:
        raise LookupError(f"model '{model_name}' has no @{registry.CHAMPION} in {uri} whose "
                          "classes and input kind can be read")
    n_classes, input_kind, _ = reads
    batch = check(uri, model_name, data, labels, n_classes, input_kind)
    return settle(uri, model_name, batch)
