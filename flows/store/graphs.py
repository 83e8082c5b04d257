"""The one way cord-ops runs a registered version: download its ONNX graph (and nothing else
of the model), check the file against the digest its run recorded, and score it with
onnxruntime.

Why not ``mlflow.pyfunc.load_model``: a registered cord-ops model is also a pyfunc model
(:mod:`flows.pyfunc_model`) whose loading *executes* the ``pyfunc_code.py`` stored with it,
so whoever can write the registry (or point a command at a store they built) would run code
as the operator. Here only two small text files are read (the ``MLmodel`` YAML, parsed with
``yaml.safe_load``, for the path of the ``onnx`` flavour's file, and the run's
``digests.json``) and the ``.onnx`` file is parsed by onnx and run by onnxruntime, which
execute no stored code. ``serve``, ``monitor``, ``promote``, ``rollback``, ``rollout``, the
gate and the label-free paths all load through :func:`fetch_graph` (docs/security.md,
item 2).

Integrity is a digest, never a metric: at log time the recalibration (and the label-free
registration) writes the manifest ``digests.json`` (every run artifact's and every model
file's SHA-256, :func:`record_digests`) and sets its own SHA-256 as the run tag
``cord.artifacts.sha256``; at load the manifest must match that tag and the downloaded
graph must match its entry, byte for byte. A version whose run has no such record cannot be
checked and is not loaded.

Scores go in by the load rule of every file and batch (``cord_ops.validation``: one score
column of a binary model as two, probability rows renormalised, narrowed to the graph's
dtype with top-1 kept), and come out of the graph as it is served, so the gate, the run's
metrics, ``promote`` and ``monitor`` report the same NLL for the same split
(:func:`run_graph`).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path, PurePosixPath

import numpy as np

from flows.errors import CordOpsError
from flows.store import tracking

#: The digest manifest artifact of a run, and the run tag holding the manifest's own digest.
DIGESTS_ARTIFACT = "digests.json"
DIGESTS_TAG = "cord.artifacts.sha256"


class GraphRejected(CordOpsError, ValueError):
    """A registered version whose graph must not be run: no ``onnx`` flavour, no digest
    record, or a file that does not match it. The message names the version and why."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def version_of(client, model_uri: str) -> tuple[str, str]:
    """(name, version) of ``models:/NAME/VERSION`` or ``models:/NAME@ALIAS``; ValueError for
    any other URI (a graph is run only as a registered version, whose run holds its digest)."""
    if not model_uri.startswith("models:/"):
        raise ValueError(f"{model_uri}: expected models:/NAME/VERSION or models:/NAME@ALIAS")
    ref = model_uri.removeprefix("models:/").strip("/")
    if "@" in ref:  # at the last "@", as MLflow's parser: a name may hold "@", an alias not
        name, alias = ref.rsplit("@", 1)
        return name, str(client.get_model_version_by_alias(name, alias).version)
    if "/" in ref:
        name, version = ref.rsplit("/", 1)
        return name, version
    raise ValueError(f"{model_uri}: expected models:/NAME/VERSION or models:/NAME@ALIAS")


def _onnx_path(mlmodel: Path, version: str) -> str:
    """The ``onnx`` flavour's file, relative to the model folder, from the MLmodel YAML."""
    import yaml

    try:
        flavors = (yaml.safe_load(mlmodel.read_text()) or {}).get("flavors") or {}
    except (yaml.YAMLError, AttributeError, UnicodeDecodeError) as exc:
        raise GraphRejected(f"v{version}: its MLmodel file cannot be read ({exc})") from None
    relative = (flavors.get("onnx") or {}).get("data") if isinstance(flavors, dict) else None
    if not relative:
        raise GraphRejected(f"v{version}: the model has no onnx flavour (flavours: "
                            f"{sorted(flavors) if isinstance(flavors, dict) else flavors}); "
                            "cord-ops runs only the ONNX graph of a model")
    parts = PurePosixPath(str(relative)).parts
    if PurePosixPath(str(relative)).is_absolute() or ".." in parts or not parts:
        raise GraphRejected(f"v{version}: the onnx flavour's file {relative!r} is not a "
                            "path inside the model folder")
    return PurePosixPath(*parts).as_posix()


def recorded_digests(client, run_id: str | None, version: str, folder: Path) -> dict:
    """The digest manifest of ``run_id`` (:data:`DIGESTS_ARTIFACT`), checked against the run
    tag :data:`DIGESTS_TAG`. GraphRejected when the run holds no record or the manifest does
    not match it; store errors propagate (a store that is down is retried, not judged)."""
    if not run_id:
        raise GraphRejected(f"v{version} has no run, so no digest record to check its graph "
                            "against; it is not loaded")
    run = client.get_run(run_id)
    expected = run.data.tags.get(DIGESTS_TAG)
    if not expected:
        raise GraphRejected(f"v{version}: its run {run_id} recorded no digests (run tag "
                            f"{DIGESTS_TAG}), so its graph cannot be checked; it is not loaded")
    # from the run's artifact folder directly (the runs:/ repository would look the run up
    # again, and its logged models too)
    local = tracking.download(
        client.tracking_uri, f"{run.info.artifact_uri.rstrip('/')}/{DIGESTS_ARTIFACT}", folder)
    found = sha256_file(local)
    if found != expected:
        raise GraphRejected(f"v{version}: its run's {DIGESTS_ARTIFACT} (sha256 {found[:12]}) "
                            f"is not the one recorded at log time ({expected[:12]})")
    try:
        return json.loads(local.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise GraphRejected(f"v{version}: its run's {DIGESTS_ARTIFACT} is not JSON "
                            f"({exc})") from None


def _model_file(location: str, relative: str, folder: Path, tracking_uri: str,
                version: str) -> Path:
    """Download one file of a version's model folder. A file the artifact store does not
    hold is GraphRejected naming it; any other failure (a store that is down) propagates."""
    import mlflow.artifacts

    try:
        return tracking.download(tracking_uri, f"{location}/{relative}", folder)
    except Exception:
        parent, _, leaf = f"{location}/{relative}".rpartition("/")
        listed = mlflow.artifacts.list_artifacts(artifact_uri=parent, tracking_uri=tracking_uri)
        if any(f.path.rsplit("/", 1)[-1] == leaf for f in listed or ()):
            raise  # it is there: the download itself failed
    raise GraphRejected(f"v{version}: its model file {relative} is missing from the artifact "
                        f"store (no {leaf} under {parent}); nothing of the model was run")


def fetch_graph(client, tracking_uri: str, name: str, version: str, folder: Path) -> Path:
    """Download the ``.onnx`` file of ``name`` v``version`` (the ``onnx`` flavour's file,
    nothing else of the model) into ``folder`` and check it against the SHA-256 its run
    recorded at log time. Raises GraphRejected for a version that must not be run; store
    errors propagate (the serve follower retries them)."""
    mv = client.get_model_version(name, version)
    location = client.get_model_version_download_uri(name, version).rstrip("/")
    manifest = recorded_digests(client, mv.run_id, version, folder / "digests")
    mlmodel = _model_file(location, "MLmodel", folder / "mlmodel", tracking_uri, version)
    relative = _onnx_path(mlmodel, version)
    model = manifest.get("model") if isinstance(manifest, dict) else None
    files = model.get("files") if isinstance(model, dict) else None
    expected = files.get(relative) if isinstance(files, dict) else None
    if not expected:
        raise GraphRejected(f"v{version}: its run's {DIGESTS_ARTIFACT} records no digest for "
                            f"the model file {relative}; it is not loaded")
    path = _model_file(location, relative, folder / "graph", tracking_uri, version)
    found = sha256_file(path)
    if found != expected:
        raise GraphRejected(f"v{version}: its ONNX graph {relative} (sha256 {found[:12]}) is "
                            f"not the file its run recorded at log time ({expected[:12]})")
    return path


def load_graph(client, name: str, version: str):
    """The checked ONNX ModelProto of ``name`` v``version`` (:func:`fetch_graph`, then parsed
    and checked by ``onnx``); ValueError for a file that is not a valid model."""
    from onnx_export.export import load_model

    with tempfile.TemporaryDirectory(prefix="cord-ops-model-") as tmp:
        return load_model(fetch_graph(client, client.tracking_uri, name, version, Path(tmp)))


def graph_input(graph) -> tuple[int, str, str]:
    """(K, input kind, dtype) a cord-ops pipeline graph reads, from its metadata; ValueError
    for a graph without them (not a cord-ops pipeline)."""
    from onnx_export.export import model_metadata

    meta = model_metadata(graph)
    try:
        return int(meta["cord.n_classes"]), meta["cord.input_kind"], meta["cord.dtype"]
    except (KeyError, ValueError) as exc:
        raise ValueError(f"not a cord-ops pipeline graph (metadata {exc} missing)") from None


def run_graph(graph, scores, outputs: list[str] | None = None) -> dict[str, np.ndarray]:
    """Every output of ``graph`` (or those named) on ``scores``: the load rule of
    ``cord_ops.validation`` (binary one-column scores as two, probability rows renormalised,
    narrowed to the graph's dtype), one onnxruntime CPU session, fixed-size batches.

    The recalibration's parity check, its gate, the run's metrics and every later score of
    the registered version go through here, so one graph on one split gives one NLL.
    """
    from cord_ops.validation import narrowed, stored_scores
    from onnx_export.runtime import open_session, run_batched

    n_classes, kind, dtype = graph_input(graph)
    loaded = stored_scores(scores, kind, n_classes=n_classes)
    session = open_session(graph, provider="cpu", spin=False)
    # A fixed batch size (run_batched's default follows the core count): the same rows go
    # through onnxruntime in the same batches on any machine, so they give the same figures.
    return run_batched(session, narrowed(loaded, dtype), batch_size=SCORE_BATCH_ROWS,
                       outputs=outputs)


#: Rows per onnxruntime run in :func:`run_graph`.
SCORE_BATCH_ROWS = 4096


def run_version(client, name: str, version: str, scores) -> dict[str, np.ndarray]:
    """Load ``name`` v``version`` (:func:`load_graph`) and run it on ``scores``
    (:func:`run_graph`); every output by name."""
    return run_graph(load_graph(client, name, version), scores)


def record_digests(client, uri: str, run_id: str, model_uri: str, graph,
                   run_digests: dict[str, str], folder: Path) -> str:
    """Check the logged model of ``model_uri`` against ``graph`` (the bytes whose parity was
    verified) and record the manifest: ``{"run": run_digests, "model": {"uri", "files"}}``
    as :data:`DIGESTS_ARTIFACT`, its SHA-256 as the run tag :data:`DIGESTS_TAG`, read back.
    Returns that digest. ValueError when the uploaded ONNX file differs (nothing may be
    registered then). ``folder``: an empty scratch folder."""
    model_dir = tracking.download(uri, model_uri, folder / "model")
    model_files = {p.relative_to(model_dir).as_posix(): sha256_file(p)
                   for p in sorted(model_dir.rglob("*")) if p.is_file()}
    expected = hashlib.sha256(graph.SerializeToString()).hexdigest()
    onnx_files = [p for p in model_files if p.endswith(".onnx")]
    if [model_files[p] for p in onnx_files] != [expected]:
        raise ValueError(f"{model_uri}: the logged ONNX file(s) {onnx_files} do not match the "
                         "graph whose parity was verified; nothing registered")
    manifest = {"run": run_digests, "model": {"uri": model_uri, "files": model_files}}
    payload = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    (folder / DIGESTS_ARTIFACT).write_bytes(payload)
    client.log_artifact(run_id, str(folder / DIGESTS_ARTIFACT))
    digest = hashlib.sha256(payload).hexdigest()
    client.set_tag(run_id, DIGESTS_TAG, digest)
    back = tracking.download_from_run(uri, run_id, DIGESTS_ARTIFACT, folder / "back")
    if sha256_file(back) != digest:
        raise ValueError(f"run {run_id}: artifact {DIGESTS_ARTIFACT} differs from what was "
                         "written; nothing registered")
    return digest
