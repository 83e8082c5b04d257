"""``flows.store.graphs`` in the test process on a real embedded store: what one load
downloads (the graph, the MLmodel, the digest manifest; never the stored code), every way a
version is refused (no onnx flavour, a path outside the model folder, no run, no digest
record, a manifest or graph that is not the recorded file, a missing file), and how scores go
in (one binary column, fixed batches) against onnxruntime run directly."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import yaml
from scipy.special import softmax

from cord_ops import CORD
from cord_ops.calibrators import make_calibrator
from flows import pyfunc_model
from flows.store import graphs, registry
from onnx_export import export_onnx

K = 3


def _graph(k: int = K, seed: int = 0, dtype: str = "float32", input_kind: str = "logits"):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, 300)
    logits = rng.normal(0.0, 1.0, (300, k))
    logits[np.arange(300), labels] += 2.0
    scores = logits if input_kind == "logits" else softmax(logits, axis=1)
    calibrator = make_calibrator("ts", input_kind=input_kind).fit(scores, labels)
    cord = CORD().fit(softmax(logits, axis=1), calibrator.predict_proba(scores))
    return export_onnx(calibrator, cord, k, input_kind=input_kind, dtype=dtype)


def _direct(graph, scores: np.ndarray, dtype=np.float32) -> dict[str, np.ndarray]:
    """Every output of ``graph`` from onnxruntime itself, in one run."""
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {"scores": scores.astype(dtype)}), strict=True))


class Registered:
    """A version logged as recalibrations log it (pyfunc + onnx flavours, digest manifest)."""

    def __init__(self, client, tmp_path: Path, name: str = "m", graph=None,
                 record: bool = True):
        self.client, self.name = client, name
        self.graph = _graph() if graph is None else graph
        experiment = client.create_experiment(name)
        self.run_id = client.create_run(experiment).info.run_id
        example = np.zeros((2, self.graph.graph.input[0].type.tensor_type.shape.dim[1]
                            .dim_value), np.float32)
        info = pyfunc_model.log_model(client, self.run_id, experiment, self.graph, example)
        if record:
            scratch = tmp_path / f"record-{name}"
            scratch.mkdir()
            self.digest = graphs.record_digests(client, client.tracking_uri, self.run_id,
                                                info.model_uri, self.graph, {"a.txt": "00"},
                                                scratch)
        registry.ensure_registered_model(client, name)
        self.version = str(client.create_model_version(
            name, source=info.model_uri, run_id=self.run_id, model_id=info.model_id).version)
        model = client.get_logged_model(info.model_id)
        self.folder = Path(model.artifact_location.removeprefix("file://"))
        self.run_folder = Path(client.get_run(self.run_id).info.artifact_uri
                               .removeprefix("file://"))
        self.model_uri = info.model_uri

    def fetch(self, tmp_path: Path) -> Path:
        folder = tmp_path / f"fetch-{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        return graphs.fetch_graph(self.client, self.client.tracking_uri, self.name,
                                  self.version, folder)

    def rejected(self, tmp_path: Path) -> str:
        with pytest.raises(graphs.GraphRejected) as caught:
            self.fetch(tmp_path)
        return str(caught.value)


@pytest.fixture
def client(store):
    from mlflow import MlflowClient

    return MlflowClient()


@pytest.fixture
def version(client, tmp_path) -> Registered:
    return Registered(client, tmp_path)


def test_a_load_reads_the_graph_manifest_and_mlmodel_only(version, tmp_path):
    path = version.fetch(tmp_path)
    assert path.read_bytes() == version.graph.SerializeToString()
    fetched = sorted(p.relative_to(path.parents[1]).as_posix()
                     for p in path.parents[1].rglob("*") if p.is_file())
    assert fetched == ["digests/digests.json", "graph/model.onnx", "mlmodel/MLmodel"]
    assert (version.folder / "pyfunc_code.py").is_file()  # stored, never fetched
    # the manifest: the run digests given, every model file, its digest the run tag
    manifest_bytes = (version.run_folder / graphs.DIGESTS_ARTIFACT).read_bytes()
    assert hashlib.sha256(manifest_bytes).hexdigest() == version.digest == \
        version.client.get_run(version.run_id).data.tags[graphs.DIGESTS_TAG]
    manifest = json.loads(manifest_bytes)
    assert manifest["run"] == {"a.txt": "00"}
    assert manifest["model"]["uri"] == version.model_uri
    assert manifest["model"]["files"]["artifacts/model.onnx"] == hashlib.sha256(
        version.graph.SerializeToString()).hexdigest()
    assert manifest["model"]["files"]["pyfunc_code.py"] == hashlib.sha256(
        (version.folder / "pyfunc_code.py").read_bytes()).hexdigest()


def test_versions_are_named_by_number_or_alias_only(version):
    client = version.client
    assert graphs.version_of(client, "models:/m/1") == ("m", "1")
    assert graphs.version_of(client, "models:/team/m/12/") == ("team/m", "12")
    assert graphs.version_of(client, "models:/Xray/7") == ("Xray", "7")
    client.set_registered_model_alias("m", "champion", version.version)
    assert graphs.version_of(client, "models:/m@champion") == ("m", version.version)
    # a model name may hold "@" (MLflow refuses only "/" and ":"); an alias may not, so
    # MLflow's own URI parser splits at the last "@"
    registry.ensure_registered_model(client, "a@b")
    client.create_model_version("a@b", source=str(version.folder))
    client.create_model_version("a@b", source=str(version.folder))
    client.set_registered_model_alias("a@b", "champion", "2")
    assert graphs.version_of(client, "models:/a@b@champion") == ("a@b", "2")
    # and the download path of batch predict resolves it the same way
    from flows.store.tracking import resolve_model_uri

    assert resolve_model_uri(client, "models:/a@b@champion") == \
        client.get_model_version_download_uri("a@b", "2")
    for uri in ("runs:/abc/model", "models:/m-0123", "m/1", ""):
        with pytest.raises(ValueError, match="expected models:/NAME/VERSION or "
                                             "models:/NAME@ALIAS"):
            graphs.version_of(client, uri)


def test_a_version_without_a_digest_record_is_not_loaded(client, tmp_path):
    unrecorded = Registered(client, tmp_path, "bare", record=False)
    assert unrecorded.rejected(tmp_path) == (
        f"v1: its run {unrecorded.run_id} recorded no digests (run tag "
        "cord.artifacts.sha256), so its graph cannot be checked; it is not loaded")
    registry.ensure_registered_model(client, "runless")
    client.create_model_version("runless", source=str(tmp_path))
    with pytest.raises(graphs.GraphRejected) as caught:
        graphs.fetch_graph(client, client.tracking_uri, "runless", "1", tmp_path / "r")
    assert str(caught.value) == ("v1 has no run, so no digest record to check its graph "
                                 "against; it is not loaded")


def test_a_manifest_or_graph_other_than_the_recorded_one_is_refused(version, tmp_path):
    manifest = version.run_folder / graphs.DIGESTS_ARTIFACT
    good = manifest.read_bytes()
    manifest.write_bytes(good.replace(b'"00"', b'"01"'))
    found = hashlib.sha256(manifest.read_bytes()).hexdigest()
    assert version.rejected(tmp_path) == (
        f"v1: its run's digests.json (sha256 {found[:12]}) is not the one recorded at log "
        f"time ({version.digest[:12]})")
    # a manifest without the graph's entry, its tag rewritten to match: no digest to check
    body = json.loads(good)
    del body["model"]["files"]["artifacts/model.onnx"]
    manifest.write_text(json.dumps(body))
    version.client.set_tag(version.run_id, graphs.DIGESTS_TAG,
                           hashlib.sha256(manifest.read_bytes()).hexdigest())
    assert version.rejected(tmp_path) == ("v1: its run's digests.json records no digest for "
                                          "the model file artifacts/model.onnx; it is not "
                                          "loaded")
    for body in ([], {"model": []}, {"model": {"files": "x"}}):
        manifest.write_text(json.dumps(body))
        version.client.set_tag(version.run_id, graphs.DIGESTS_TAG,
                               hashlib.sha256(manifest.read_bytes()).hexdigest())
        assert version.rejected(tmp_path).startswith(
            "v1: its run's digests.json records no digest for the model file ")
    manifest.write_text("not json")
    version.client.set_tag(version.run_id, graphs.DIGESTS_TAG,
                           hashlib.sha256(b"not json").hexdigest())
    assert version.rejected(tmp_path).startswith("v1: its run's digests.json is not JSON (")
    manifest.write_bytes(good)
    version.client.set_tag(version.run_id, graphs.DIGESTS_TAG, version.digest)
    assert version.fetch(tmp_path).is_file()

    graph = version.folder / "artifacts" / "model.onnx"
    other = _graph(seed=1).SerializeToString()
    graph.write_bytes(other)
    recorded = json.loads(good)["model"]["files"]["artifacts/model.onnx"]
    assert version.rejected(tmp_path) == (
        f"v1: its ONNX graph artifacts/model.onnx (sha256 "
        f"{hashlib.sha256(other).hexdigest()[:12]}) is not the file its run recorded at log "
        f"time ({recorded[:12]})")
    graph.unlink()
    location = version.client.get_model_version_download_uri("m", "1").rstrip("/")
    assert version.rejected(tmp_path) == (
        f"v1: its model file artifacts/model.onnx is missing from the artifact store (no "
        f"model.onnx under {location}/artifacts); nothing of the model was run")


def test_a_file_that_is_there_but_cannot_be_downloaded_is_not_called_missing(version,
                                                                             tmp_path):
    # the download fails (its destination is a file), the listing finds the file: the
    # store's own error comes through, to be retried, not a verdict on the version
    blocked = tmp_path / "blocked"
    blocked.write_text("")
    location = version.client.get_model_version_download_uri("m", "1").rstrip("/")
    for relative in ("MLmodel", "artifacts/model.onnx"):
        with pytest.raises(Exception) as caught:
            graphs._model_file(location, relative, blocked, version.client.tracking_uri, "1")
        assert not isinstance(caught.value, graphs.GraphRejected), caught.value


def test_the_mlmodel_must_name_an_onnx_file_inside_the_model(version, tmp_path):
    mlmodel = version.folder / "MLmodel"
    good = yaml.safe_load(mlmodel.read_text())
    for data, why in (("../../x.onnx", "'../../x.onnx' is not a path inside the model folder"),
                      ("/etc/passwd", "'/etc/passwd' is not a path inside the model folder")):
        edited = {**good, "flavors": {**good["flavors"], "onnx": {"data": data}}}
        mlmodel.write_text(yaml.safe_dump(edited))
        assert version.rejected(tmp_path) == f"v1: the onnx flavour's file {why}"
    mlmodel.write_text(yaml.safe_dump({**good, "flavors": {
        "python_function": good["flavors"]["python_function"]}}))
    assert version.rejected(tmp_path) == (
        "v1: the model has no onnx flavour (flavours: ['python_function']); cord-ops runs "
        "only the ONNX graph of a model")
    mlmodel.write_text("flavors: [b, a]")  # not a mapping: named as it is, not sorted
    assert version.rejected(tmp_path) == (
        "v1: the model has no onnx flavour (flavours: ['b', 'a']); cord-ops runs only the "
        "ONNX graph of a model")
    mlmodel.write_text("flavors: [unclosed")
    assert version.rejected(tmp_path).startswith("v1: its MLmodel file cannot be read (")
    # a path with "." parts is the same file
    edited = {**good, "flavors": {**good["flavors"], "onnx": {"data": "./artifacts/model.onnx"}}}
    mlmodel.write_text(yaml.safe_dump(edited))
    assert version.fetch(tmp_path).read_bytes() == version.graph.SerializeToString()
    (version.folder / "MLmodel").unlink()
    location = version.client.get_model_version_download_uri("m", "1").rstrip("/")
    assert version.rejected(tmp_path) == (
        f"v1: its model file MLmodel is missing from the artifact store (no MLmodel under "
        f"{location}); nothing of the model was run")


def test_scores_go_in_by_the_load_rule_in_fixed_batches(version, client):
    rng = np.random.default_rng(3)
    scores = rng.normal(0.0, 3.0, (graphs.SCORE_BATCH_ROWS + 7, K))
    got = registry.run_registered_model(client, "models:/m/1", scores)
    expected = _direct(version.graph, scores)
    assert set(got) == set(expected) == {"repaired", "calibrated", "original", "label",
                                         "confidence"}
    for name in expected:
        assert got[name].dtype == expected[name].dtype
        assert np.array_equal(got[name], expected[name]), name
    assert list(graphs.run_graph(version.graph, scores[:5], ["label"])) == ["label"]
    with pytest.raises(ValueError, match=r"scores: expected 3 classes"):
        graphs.run_graph(version.graph, scores[:, :2])

    binary = _graph(k=2, dtype="float64")
    column = rng.uniform(-4.0, 4.0, 9)
    two = np.stack([np.zeros(9), column], axis=1)
    from_one = graphs.run_graph(binary, column)
    assert np.array_equal(from_one["repaired"], graphs.run_graph(binary, two)["repaired"])
    assert np.array_equal(from_one["repaired"], _direct(binary, two, np.float64)["repaired"])

    # float32 values one ulp apart at the top, the row off 1 by 6.9e-5: renormalised and
    # cast to float32 they would tie (class 0); the graph gets the stored order (class 1)
    near_tie = np.array([[0.4202351, 0.42023513, 0.15959924]], dtype=np.float32)
    probs = _graph(input_kind="probs")
    assert graphs.run_graph(probs, near_tie.astype(np.float64))["label"].tolist() == [1]

    import onnx

    foreign = onnx.load_model_from_string(binary.SerializeToString())
    del foreign.metadata_props[:]
    with pytest.raises(ValueError, match=r"not a cord-ops pipeline graph \(metadata "
                                         r"'cord.n_classes' missing\)"):
        graphs.run_graph(foreign, two)


def test_record_refuses_an_uploaded_graph_that_is_not_the_verified_one(version, tmp_path):
    other = _graph(seed=2)
    (tmp_path / "scratch").mkdir()
    with pytest.raises(ValueError, match=r"the logged ONNX file\(s\) \['artifacts/model.onnx'\] "
                                         r"do not match the graph whose parity was verified"):
        graphs.record_digests(version.client, version.client.tracking_uri, version.run_id,
                              version.model_uri, other, {}, tmp_path / "scratch")


class _Recording(ort.InferenceSession):
    """onnxruntime's own session, remembering how it was opened and the rows of each run."""

    opened: list[dict] = []

    def __init__(self, model, sess_options=None, providers=None, **kwargs):
        super().__init__(model, sess_options=sess_options, providers=providers, **kwargs)
        self.rows: list[int] = []
        _Recording.opened.append({"options": sess_options, "providers": providers,
                                  "rows": self.rows})

    def run(self, names, feed, *args, **kwargs):
        self.rows.extend(len(v) for v in feed.values())
        return super().run(names, feed, *args, **kwargs)


def test_scores_run_on_a_cpu_session_that_does_not_spin_in_batches_of_4096(version,
                                                                         monkeypatch):
    from onnx_export import runtime

    scores = np.random.default_rng(4).normal(0.0, 3.0, (4096 + 7, K))
    expected = _direct(version.graph, scores)["repaired"]
    _Recording.opened = []
    monkeypatch.setattr(runtime.ort, "InferenceSession", _Recording)
    # as on a machine with a GPU: "auto" would ask for CUDA there, "cpu" never does
    monkeypatch.setattr(runtime, "cuda_available", lambda: True)
    assert np.array_equal(graphs.run_graph(version.graph, scores)["repaired"], expected)
    [opened] = _Recording.opened
    assert opened["providers"] == ["CPUExecutionProvider"]
    assert opened["options"].get_session_config_entry(
        "session.intra_op.allow_spinning") == "0"
    assert opened["rows"] == [4096, 7]


def _other_store(store_at, tmp_path: Path):
    """A client of a store that is not the process's MLFLOW_TRACKING_URI."""
    from mlflow import MlflowClient

    uri = store_at(tmp_path / "other" / "mlflow.db")
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def test_recording_uses_the_store_it_is_given_not_the_processs(store, store_at, tmp_path):
    # (MLflow's registry looks a version's logged model up in the process's store, so this
    # store's models are logged and recorded here, not registered)
    other = _other_store(store_at, tmp_path)
    assert other.tracking_uri != store
    graph = _graph()
    experiment = other.create_experiment("elsewhere")
    run_id = other.create_run(experiment).info.run_id
    info = pyfunc_model.log_model(other, run_id, experiment, graph, np.zeros((2, K), np.float32))
    (tmp_path / "scratch").mkdir()
    digest = graphs.record_digests(other, other.tracking_uri, run_id, info.model_uri, graph,
                                   {"a.txt": "00"}, tmp_path / "scratch")
    assert other.get_run(run_id).data.tags[graphs.DIGESTS_TAG] == digest
    manifest = Path(other.get_run(run_id).info.artifact_uri.removeprefix("file://"),
                    graphs.DIGESTS_ARTIFACT).read_bytes()
    assert hashlib.sha256(manifest).hexdigest() == digest


def test_the_manifest_digest_does_not_depend_on_the_order_of_the_run_digests(version,
                                                                             tmp_path):
    digests = []
    for i, run_digests in enumerate(({"b.txt": "01", "a.txt": "00"},
                                     {"a.txt": "00", "b.txt": "01"})):
        (tmp_path / f"order-{i}").mkdir()
        digests.append(graphs.record_digests(
            version.client, version.client.tracking_uri, version.run_id, version.model_uri,
            version.graph, run_digests, tmp_path / f"order-{i}"))
    assert digests[0] == digests[1]


def test_recording_writes_only_into_its_scratch_folder(version, tmp_path, monkeypatch):
    import tempfile

    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))
    working = tmp_path / "working"
    working.mkdir()
    monkeypatch.chdir(working)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    graphs.record_digests(version.client, version.client.tracking_uri, version.run_id,
                          version.model_uri, version.graph, {}, scratch)
    assert list(working.iterdir()) == []
    assert list(system_tmp.iterdir()) == []
    assert (scratch / graphs.DIGESTS_ARTIFACT).is_file()


def test_a_manifest_the_store_does_not_keep_as_written_is_refused(version, tmp_path):
    from mlflow import MlflowClient

    class Altering(MlflowClient):
        """A store that keeps something other than the file it is handed."""

        def log_artifact(self, run_id, local_path, artifact_path=None):
            Path(local_path).write_bytes(Path(local_path).read_bytes() + b" ")
            super().log_artifact(run_id, local_path, artifact_path)

    altering = Altering(version.client.tracking_uri)
    (tmp_path / "altered").mkdir()
    with pytest.raises(ValueError) as caught:
        graphs.record_digests(altering, altering.tracking_uri, version.run_id,
                              version.model_uri, version.graph, {}, tmp_path / "altered")
    assert str(caught.value) == (f"run {version.run_id}: artifact digests.json differs from "
                                 "what was written; nothing registered")


def test_a_version_whose_source_ends_in_a_slash_loads_from_that_folder(version, tmp_path):
    import shutil

    copy = tmp_path / "copyX"  # a folder name ending in a letter the strip must keep
    shutil.copytree(version.folder, copy)
    number = version.client.create_model_version("m", source=f"{copy}/",
                                                 run_id=version.run_id).version
    assert version.client.get_model_version_download_uri("m", number) == f"{copy}/"
    (tmp_path / "slash").mkdir()
    path = graphs.fetch_graph(version.client, version.client.tracking_uri, "m", str(number),
                              tmp_path / "slash")
    assert path.read_bytes() == version.graph.SerializeToString()
    (copy / "artifacts" / "model.onnx").unlink()
    (tmp_path / "slash-missing").mkdir()
    with pytest.raises(graphs.GraphRejected) as caught:
        graphs.fetch_graph(version.client, version.client.tracking_uri, "m", str(number),
                           tmp_path / "slash-missing")
    assert str(caught.value) == (
        f"v{number}: its model file artifacts/model.onnx is missing from the artifact store "
        f"(no model.onnx under {copy}/artifacts); nothing of the model was run")


def test_every_download_and_listing_asks_the_store_of_the_client(version, tmp_path,
                                                                  monkeypatch):
    # with its artifacts in local folders the store's URI changes nothing here; a served
    # store's proxied artifacts (mlflow-artifacts:) are reached through it, and None would
    # mean the process's MLFLOW_TRACKING_URI instead of the store the command was given
    import mlflow.artifacts

    asked = []
    for name in ("download_artifacts", "list_artifacts"):
        real = getattr(mlflow.artifacts, name)

        def passing(*args, _real=real, _name=name, **kwargs):
            asked.append((_name, kwargs.get("tracking_uri")))
            return _real(*args, **kwargs)

        monkeypatch.setattr(mlflow.artifacts, name, passing)
    uri = version.client.tracking_uri
    assert graphs.load_graph(version.client, "m", "1") == version.graph
    assert asked == [("download_artifacts", uri)] * 3
    (version.folder / "artifacts" / "model.onnx").unlink()
    asked.clear()
    version.rejected(tmp_path)
    assert asked == [("download_artifacts", uri)] * 3 + [("list_artifacts", uri)]


def test_a_listed_file_whose_name_holds_a_space_is_not_called_missing(version, tmp_path):
    (version.folder / "artifacts" / "my model.onnx").write_bytes(b"")
    blocked = tmp_path / "blocked"
    blocked.write_text("")  # the download fails: its destination is a file
    location = version.client.get_model_version_download_uri("m", "1").rstrip("/")
    with pytest.raises(Exception) as caught:
        graphs._model_file(location, "artifacts/my model.onnx", blocked,
                           version.client.tracking_uri, "1")
    assert not isinstance(caught.value, graphs.GraphRejected), caught.value
