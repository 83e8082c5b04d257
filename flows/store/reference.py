"""The pinned reference split: the evaluation split a version was gated on, kept with its
run so later gates can score new candidates on it.

Each recalibration run stores its evaluation split as the artifact
``reference/evaluation.npz`` (the validated .npz format of :mod:`cord_ops.data`, no pickle)
and records it as an MLflow dataset input of the run (context ``evaluation``) whose source
is that artifact's URI, whose digest is the start of the file's SHA-256 and whose profile
holds the full SHA-256, rows, K, input kind and label counts. :func:`load_reference_split`
finds it again from the run alone and refuses a file whose bytes no longer match.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from cord_ops import data
from flows.errors import CordOpsError
from flows.store import retries, tracking

ARTIFACT_DIR = "reference"
ARTIFACT_NAME = "evaluation.npz"
DATASET_NAME = "evaluation-split"
CONTEXT_TAG = "mlflow.data.context"
CONTEXT = "evaluation"
#: MLflow caps a dataset digest at 36 characters; the profile keeps the full SHA-256.
DIGEST_LENGTH = 32


class ReferenceUnavailable(CordOpsError, LookupError):
    """The run has no usable reference split (never logged, artifact gone or altered)."""


def _source(uri: str, run_id: str) -> tuple[str, str]:
    """(source type, source JSON) for the artifact URI, as MLflow's resolver sees it;
    stores whose artifact scheme MLflow does not resolve (mlflow-artifacts:/) keep the
    URI and the run id, which is how :func:`load_reference_split` reads it back anyway."""
    import warnings

    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    try:
        with warnings.catch_warnings():  # "can be interpreted in multiple ways": local
            warnings.simplefilter("ignore")
            source = resolve_dataset_source(uri)
        # A dataset's public dict names its source's type; the digest given skips hashing.
        described = MetaDataset(source, name=DATASET_NAME, digest="-").to_dict()
        return described["source_type"], described["source"]
    except Exception:
        return "mlflow-artifact", json.dumps({"uri": uri, "run_id": run_id})


def log_reference_split(client, run_id: str, evaluation: data.Dataset) -> str:
    """Store ``evaluation`` as the run's reference split and dataset input; returns the
    file's SHA-256."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    with tempfile.TemporaryDirectory(prefix="cord-ops-reference-") as tmp:
        path = data.save_npz(Path(tmp) / ARTIFACT_NAME, evaluation.scores, evaluation.labels,
                             evaluation.input_kind)
        sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
        client.log_artifact(run_id, str(path), ARTIFACT_DIR)
    uri = f"{client.get_run(run_id).info.artifact_uri.rstrip('/')}/{ARTIFACT_DIR}/{ARTIFACT_NAME}"
    source_type, source = _source(uri, run_id)
    profile = {"rows": evaluation.n, "n_classes": evaluation.n_classes,
               "input_kind": evaluation.input_kind, "sha256": sha256,
               "label_counts": np.bincount(evaluation.labels,
                                           minlength=evaluation.n_classes).tolist(),
               "source_file": evaluation.path, "source_file_sha256": evaluation.sha256}
    entity = Dataset(name=DATASET_NAME, digest=sha256[:DIGEST_LENGTH], source_type=source_type,
                     source=source, profile=json.dumps(profile))
    _log_input(client, run_id, DatasetInput(entity, [InputTag(CONTEXT_TAG, CONTEXT)]))
    return sha256


def _log_input(client, run_id: str, dataset_input, attempts: int = 3) -> None:
    """``log_inputs``, tolerating the race of concurrent runs over one dataset row.

    MLflow's database store looks a dataset up by (experiment, name, digest) and inserts it
    when absent, without a lock: runs that pin the same split at the same moment both
    insert and all but one hit the unique constraint. The row then exists, so logging again
    links this run to it (the split itself is read from each run's own artifact).
    """
    from mlflow.exceptions import MlflowException

    for attempt in range(attempts):
        try:
            client.log_inputs(run_id, datasets=[dataset_input])
            return
        except MlflowException as exc:
            if not retries.is_insert_race(exc) or attempt == attempts - 1:
                raise


def reference_input(client, run_id: str):
    """The run's reference dataset input (the last one logged), or None."""
    found = [d for d in client.get_run(run_id).inputs.dataset_inputs
             if d.dataset.name == DATASET_NAME
             and any(t.key == CONTEXT_TAG and t.value == CONTEXT for t in d.tags)]
    return found[-1] if found else None


def load_reference_split(client, run_id: str) -> data.Dataset:
    """The reference split of ``run_id``, validated and digest-checked.

    Raises :class:`ReferenceUnavailable` saying why it cannot be used. ``path`` of the
    returned dataset is the artifact URI the dataset input records.
    """
    if not run_id:
        raise ReferenceUnavailable("the version has no run")
    found = reference_input(client, run_id)
    if found is None:
        raise ReferenceUnavailable(f"run {run_id} logged no evaluation dataset input")
    try:
        profile = json.loads(found.dataset.profile or "{}")
        source = json.loads(found.dataset.source).get("uri", "")
    except (json.JSONDecodeError, AttributeError) as exc:
        raise ReferenceUnavailable(f"run {run_id}: unreadable dataset input ({exc})") from None
    with tempfile.TemporaryDirectory(prefix="cord-ops-reference-") as tmp:
        try:
            local = tracking.download_from_run(client.tracking_uri, run_id,
                                               f"{ARTIFACT_DIR}/{ARTIFACT_NAME}", tmp)
            raw = Path(local).read_bytes()
        except Exception as exc:
            raise ReferenceUnavailable(f"run {run_id}: {ARTIFACT_DIR}/{ARTIFACT_NAME} cannot be "
                                       f"downloaded ({type(exc).__name__})") from None
        sha256 = hashlib.sha256(raw).hexdigest()
        if sha256 != profile.get("sha256") or sha256[:DIGEST_LENGTH] != found.dataset.digest:
            raise ReferenceUnavailable(f"run {run_id}: reference split's digest {sha256[:12]} "
                                       "does not match the one logged")
        try:
            split = data.load_npz(local)
        except (ValueError, TypeError) as exc:
            raise ReferenceUnavailable(str(exc)) from None
    return replace(split, path=source or f"runs:/{run_id}/{ARTIFACT_DIR}/{ARTIFACT_NAME}")
