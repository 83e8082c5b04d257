"""Where runs and models are recorded, and the explicit MLflow calls that record them.

The store is the one ``MLFLOW_TRACKING_URI`` names or, by default, the embedded
``sqlite:///<cwd>/mlruns/mlflow.db`` with artifacts under ``<cwd>/mlruns/`` (MLflow 3 keeps
the plain file store in maintenance mode, so the registry needs a database).

Nothing here changes process-wide state: no ``mlflow.set_tracking_uri``, no
``mlflow.set_experiment``, no ``os.environ`` edits. Every call takes an explicit
``MlflowClient(tracking_uri)`` (from :func:`client`) and explicit experiment and run ids,
so two flows in one process can write to two stores. The one exception is forced by
MLflow and undone within the call: :func:`registry_lookups`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from flows.errors import CordOpsError
from flows.redact import redact

STORE_DIR = "mlruns"
DB_NAME = "mlflow.db"
#: Serialises the one place MLflow forces a process-wide URI (:func:`registry_lookups`).
_GLOBAL_URI_LOCK = threading.Lock()

#: Environment that keeps MLflow and Prefect from phoning home. The ``cord-ops`` program
#: applies it to its own process (a user's explicit choice wins); library code only hands
#: it to the subprocesses it starts (:func:`subprocess_environment`).
QUIET_ENVIRONMENT = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
}


def subprocess_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process: this one's, the quiet defaults where unset,
    then ``extra``. This process's own environment is left as it is."""
    env = {**QUIET_ENVIRONMENT, **os.environ}
    env.update(extra or {})
    return env


def embedded_store_uri(cwd: str | os.PathLike | None = None) -> str:
    """The embedded default tracking URI for ``cwd`` (default: the working directory)."""
    root = Path(cwd or os.getcwd()).resolve() / STORE_DIR
    return f"sqlite:///{root / DB_NAME}"


def tracking_uri() -> str:
    """MLFLOW_TRACKING_URI when set, else the embedded default of the working directory."""
    return os.environ.get("MLFLOW_TRACKING_URI") or embedded_store_uri()


def is_embedded(uri: str) -> bool:
    """True for a local sqlite store (artifacts then live beside it, under ./mlruns)."""
    return uri.startswith("sqlite:///")


def store_uri(uri: str | None = None) -> str:
    """``uri`` (default :func:`tracking_uri`), ready to use: for a local sqlite store the
    folder is created first so the first run needs no setup."""
    uri = uri or tracking_uri()
    if is_embedded(uri):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return uri


def client(uri: str):
    """An ``MlflowClient`` bound to ``uri`` for both runs and the model registry."""
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def experiment_id(mlflow_client, name: str) -> str:
    """The id of experiment ``name`` in ``mlflow_client``'s store, created on first use.

    In the embedded store MLflow places a new experiment's artifacts under ``./mlruns/<id>``.
    """
    from mlflow.exceptions import MlflowException

    found = mlflow_client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return mlflow_client.create_experiment(name)
    except MlflowException:
        # Another process created it between the lookup and the create.
        found = mlflow_client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def log_values(mlflow_client, run_id: str, metrics: Mapping[str, float] | None = None,
               params: Mapping[str, object] | None = None, tags: Mapping[str, str] | None = None,
               step: int = 0, steps: Mapping[int, Mapping[str, float]] | None = None,
               finite_only: bool = False) -> None:
    """Log metrics (at ``step``, plus per-step curves ``steps``), params and tags (as
    ``str``, credentials in URIs redacted: :func:`flows.redact.redact`) of one run in a
    single ``log_batch`` call, all with one timestamp.

    ``finite_only`` skips NaN and infinite metrics (and None) at ``step``: where a value is
    undefined by construction (eta* of minimal repair) a missing metric reads more honestly
    than a NaN one.
    """
    import math

    from mlflow.entities import Metric, Param, RunTag

    now = int(time.time() * 1000)
    entries = [Metric(k, float(v), now, step) for k, v in (metrics or {}).items()
               if not finite_only or (v is not None and math.isfinite(float(v)))]
    for at, values in (steps or {}).items():
        entries += [Metric(k, float(v), now, at) for k, v in values.items()]
    mlflow_client.log_batch(run_id, metrics=entries,
                            params=[Param(k, redact(v)) for k, v in (params or {}).items()],
                            tags=[RunTag(k, redact(v)) for k, v in (tags or {}).items()])


def log_model(mlflow_client, run_id: str, name: str, save: Callable[[str, object], None],
              experiment_id: str | None = None):
    """Log a model of ``run_id`` under the run's own experiment, with explicit ids only.

    What ``mlflow.<flavor>.log_model`` does, minus its reliance on the process's active
    experiment and tracking URI: create the LoggedModel (params copied from the run, the
    run's step-0 metrics linked to it), let ``save(path, mlflow_model)`` write the flavor's
    files (e.g. ``mlflow.onnx.save_model(..., mlflow_model=mlflow_model)``), upload them,
    mark the model READY and record it as the run's output. Returns the ``ModelInfo``.
    ``experiment_id`` defaults to the run's.
    """
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus, Metric
    from mlflow.models import Model
    from mlflow.tracking.context import registry as context_registry

    run = mlflow_client.get_run(run_id)
    logged = mlflow_client.create_logged_model(
        experiment_id or run.info.experiment_id, name=name, source_run_id=run_id,
        params=dict(run.data.params),
        tags={k: redact(v) for k, v in context_registry.resolve_tags().items()})
    mlflow_client.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=0)])
    linked = [Metric(key, value, int(time.time() * 1000), 0, run_id=run_id,
                     model_id=logged.model_id) for key, value in run.data.metrics.items()]
    if linked:
        mlflow_client.log_batch(run_id, metrics=linked)
    mlflow_model = Model(artifact_path=logged.artifact_location, model_uuid=logged.model_id,
                         run_id=run_id, model_id=logged.model_id)
    with tempfile.TemporaryDirectory(prefix="cord-ops-model-") as tmp:
        path = os.path.join(tmp, name)
        save(path, mlflow_model)
        honour_umask(path)
        mlflow_client.log_model_artifacts(logged.model_id, path)
    logged = mlflow_client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
    return mlflow_model.get_model_info(logged)


def current_umask() -> int:
    """This process's umask, read without changing it (``os.umask`` can only be read by
    setting it, which would open a window for other threads' files)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o077  # unknown: take away what an owner-only umask would


def honour_umask(folder: str | os.PathLike) -> None:
    """Take the umask's bits off every file and folder below ``folder``. Files a flavour
    copies from elsewhere (MLflow copies a model's code file with its mode, 0644 from a
    checkout) would otherwise reach the store more open than the umask allows, since the
    local artifact store copies modes too."""
    mask = current_umask()
    paths = [str(folder)]
    for root, folders, files in os.walk(folder):
        paths += [os.path.join(root, name) for name in folders + files]
    for path in paths:
        mode = os.lstat(path).st_mode
        if not os.path.islink(path) and mode & mask:
            os.chmod(path, mode & 0o7777 & ~mask)


@contextlib.contextmanager
def registry_lookups(mlflow_client):
    """Inside: MLflow's in-process database registry can find this store's logged models.

    Registering ``models:/<model_id>`` with a database registry (sqlite, postgres...) makes
    MLflow look the logged model up through the process-wide tracking URI, not the
    client's (MLflow's own TODO in ``SqlAlchemyStore.create_model_version``). For that one
    call the process-wide URI is pointed at this client's store and then put back exactly
    as it was; a lock keeps two threads from interleaving. A tracking server resolves the
    URI itself, so for HTTP stores nothing changes.

    Only public MLflow calls: ``MLFLOW_TRACKING_URI`` is what an unconfigured MLflow
    resolves, so pointing it at the store is enough unless the process pinned a URI with
    ``mlflow.set_tracking_uri`` (``mlflow.get_tracking_uri()`` then still answers the pinned
    one); only then is the pin moved, and set back to the value it answered before.
    """
    uri = mlflow_client.tracking_uri
    if uri.startswith(("http://", "https://")):
        yield
        return
    import mlflow

    with _GLOBAL_URI_LOCK:
        saved_env = os.environ.get("MLFLOW_TRACKING_URI")
        pinned = mlflow.get_tracking_uri()
        os.environ["MLFLOW_TRACKING_URI"] = uri
        repinned = mlflow.get_tracking_uri() != uri
        try:
            if repinned:
                mlflow.set_tracking_uri(uri)
            yield
        finally:
            if repinned:
                mlflow.set_tracking_uri(pinned)
            if saved_env is None:
                os.environ.pop("MLFLOW_TRACKING_URI", None)
            else:
                os.environ["MLFLOW_TRACKING_URI"] = saved_env


def resolve_model_uri(mlflow_client, model_uri: str) -> str:
    """The artifact location behind ``models:/NAME@ALIAS``, ``models:/NAME/VERSION`` or
    ``models:/<model_id>`` in ``mlflow_client``'s store; any other URI is returned as given.

    Resolved here because MLflow's own ``models:/`` repository looks names up through the
    process-wide registry URI, whatever registry URI it is handed.
    """
    if not model_uri.startswith("models:/"):
        return model_uri
    ref = model_uri.removeprefix("models:/").strip("/")
    if "@" in ref:
        # at the last @, as MLflow's parser splits: a name may hold @, an alias may not
        name, alias = ref.rsplit("@", 1)
        version = mlflow_client.get_model_version_by_alias(name, alias).version
    elif "/" in ref:
        name, version = ref.rsplit("/", 1)
    else:  # a logged model's id
        return mlflow_client.get_logged_model(ref).artifact_location
    return mlflow_client.get_model_version_download_uri(name, version)


def download(uri: str, artifact_uri: str, dst: str | os.PathLike) -> Path:
    """Download ``artifact_uri`` (``models:/NAME@ALIAS``, ``models:/NAME/VERSION``,
    ``runs:/...`` or a plain artifact URI) from the store at ``uri`` into ``dst``; returns
    the local path.

    The one artifact download of the project (run files, logged models, the digest record
    and the graph checked against it): every read goes to the store the command was given,
    never to the process's ``MLFLOW_TRACKING_URI``, and a ``models:/`` name is resolved in
    that store's registry (:func:`resolve_model_uri`).
    """
    import mlflow.artifacts

    location = (resolve_model_uri(client(uri), artifact_uri)
                if artifact_uri.startswith("models:/") else artifact_uri)
    return Path(mlflow.artifacts.download_artifacts(artifact_uri=location, dst_path=str(dst),
                                                    tracking_uri=uri, registry_uri=uri))


def download_from_run(uri: str, run_id: str, path: str, dst: str | os.PathLike) -> Path:
    """``path`` (a file or folder; ``""`` for all of them) of run ``run_id``'s artifacts into
    ``dst`` through :func:`download`: ``runs:/RUN_ID/PATH``, or the run's artifact folder
    itself for all of them, as MLflow's own run-id form reads them."""
    if path:
        return download(uri, f"runs:/{run_id}/{path}", dst)
    return download(uri, client(uri).get_run(run_id).info.artifact_uri, dst)


# ---------------------------------------------------------------- store preparation
#: Default bound, in seconds, on how long a command may spend failing against a store that
#: is down (``--store-timeout``).
DEFAULT_STORE_TIMEOUT = 60.0
#: Where in a local store folder the store-creation lock lives (beside the registry locks).
STORE_LOCK = Path(".cord-locks") / "store.lock"
SQLITE_HEADER = b"SQLite format 3\x00"


class StoreError(CordOpsError, RuntimeError):
    """The tracking store cannot be used; the message is one line naming the URI."""


def local_store_folder(uri: str) -> Path | None:
    """The folder of a store on this machine (sqlite database's folder, file store root),
    or None for a remote store."""
    if uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///")).parent
    if uri.startswith("file://"):
        return Path(uri.removeprefix("file://"))
    if "://" not in uri:
        return Path(uri)
    return None


def http_environment(store_timeout: float = DEFAULT_STORE_TIMEOUT) -> dict[str, str]:
    """MLflow HTTP client settings that keep one request's failure under about half of
    ``store_timeout``: two retries (after 1 and 2 s), each attempt timing out after a
    sixth of it. MLflow reads them only from the environment, so the CLI, as the process
    entry point, installs them with :func:`os.environ.setdefault` (a user's value wins).

    The Prefect tasks do not retry what these already retried (see :mod:`flows.store.retries`),
    so there is one retry layer, not two multiplied.
    """
    return {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.5",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, int(store_timeout // 6))),
    }


def prepare_store(uri: str, timeout: float = DEFAULT_STORE_TIMEOUT) -> None:
    """Make the store at ``uri`` ready before any run starts, or raise :class:`StoreError`.

    Embedded sqlite: create the folder, then create or upgrade the schema once, under an
    OS file lock, so processes that start together on a brand-new store do not run
    MLflow's migrations at the same time; the others wait (up to ``timeout`` s) and find
    it ready. A file that is not an SQLite database, or an SQLite database that is not an
    MLflow store, is refused with one line. Remote store: its ``/health`` must answer
    within ``timeout`` (at most 10 s of it).
    """
    if uri.startswith("sqlite:///"):
        _prepare_sqlite(uri, Path(uri.removeprefix("sqlite:///")), timeout)
    elif uri.startswith(("http://", "https://")):
        _probe_http(uri, min(timeout, 10.0))


def _check_writable(uri: str, folder: Path) -> None:
    # access() reports a read-only mount as not writable, even to root.
    if folder.is_dir() and not os.access(folder, os.W_OK):
        raise StoreError(f"{uri}: the store folder {folder} is not writable (read-only "
                         "file system or permissions)")


def _prepare_sqlite(uri: str, db: Path, timeout: float) -> None:
    from filelock import FileLock, Timeout

    _check_sqlite_file(uri, db)
    _check_writable(uri, db.parent)
    if _sqlite_ready(db):  # the common case: read-only checks, no lock
        return
    try:
        (db.parent / STORE_LOCK).parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(db.parent / STORE_LOCK, thread_local=False)
        lock.acquire(timeout=timeout)
    except Timeout as exc:
        raise StoreError(f"{uri}: another process has been creating or upgrading this "
                         f"store for over {timeout:g} s") from exc
    except OSError as exc:
        raise StoreError(f"{uri}: the store folder is not writable "
                         f"({exc.strerror or exc}: {exc.filename or db.parent})") from exc
    try:
        _check_sqlite_file(uri, db)
        if not _sqlite_ready(db):  # the process that held the lock may have done it
            _create_or_upgrade(uri, db)
    finally:
        lock.release()


def _sqlite_ready(db: Path) -> bool:
    """True when the installed MLflow already opened ``db`` under the store lock and its
    schema has not moved since: its revision and MLflow's version are those the ready mark
    recorded then (:func:`_mark_ready`), and its Default experiment exists. Nothing to
    create or upgrade then. Read-only, and MLflow is not imported.

    MLflow's public surface does not say which schema revision it expects without opening
    the store, and opening one whose tables are incomplete creates and migrates them, which
    must not happen outside the lock; so the revision to compare with is the one the store
    had when MLflow last opened it without complaint."""
    import sqlite3

    if not db.is_file() or db.stat().st_size == 0:
        return False
    try:
        connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        try:
            (revision,) = connection.execute("SELECT version_num FROM alembic_version").fetchone()
            default = connection.execute(
                "SELECT 1 FROM experiments WHERE experiment_id = 0").fetchone()
        finally:
            connection.close()
    except (sqlite3.Error, TypeError, ValueError):
        return False
    return default is not None and _ready_mark(db) == {"mlflow": _mlflow_version(),
                                                       "revision": revision}


def _mlflow_version() -> str:
    from importlib.metadata import version

    return version("mlflow")


def _ready_mark_file(db: Path) -> Path:
    return db.parent / STORE_LOCK.parent / f"{db.name}.ready.json"


def _ready_mark(db: Path) -> dict | None:
    import json

    try:
        return json.loads(_ready_mark_file(db).read_text())
    except (OSError, ValueError):
        return None


def _mark_ready(db: Path) -> None:
    """Record, under the store lock and after MLflow opened the store without complaint,
    the schema revision it has and the MLflow version that opened it (:func:`_sqlite_ready`).
    A mark that cannot be written only costs the next command the lock."""
    import json

    mark = _ready_mark_file(db)
    partial = mark.with_name(f".{mark.name}.{os.getpid()}")
    try:
        partial.write_text(json.dumps({"mlflow": _mlflow_version(), "revision": _revision(db)}))
        partial.replace(mark)
    except OSError:
        partial.unlink(missing_ok=True)


def _check_sqlite_file(uri: str, db: Path) -> None:
    if not db.exists():
        return
    try:
        with open(db, "rb") as handle:
            header = handle.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise StoreError(f"{uri}: cannot read {db} ({exc.strerror or exc})") from exc
    if header and header != SQLITE_HEADER:
        raise StoreError(f"{uri}: {db} is not an SQLite database, so not an MLflow store; "
                         "move it away or set MLFLOW_TRACKING_URI")
    if not header:
        return  # empty: sqlite treats it as a new database
    import sqlite3

    try:
        connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        try:
            tables = {name for (name,) in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            connection.close()
    except sqlite3.Error as exc:
        raise StoreError(f"{uri}: cannot read {db} ({exc})") from exc
    if tables and "experiments" not in tables:
        raise StoreError(f"{uri}: {db} is an SQLite database but not an MLflow store "
                         f"(tables: {', '.join(sorted(tables)[:5])}); move it away or set "
                         "MLFLOW_TRACKING_URI")


#: What MLflow's store says when it opens a database at an older schema revision.
OUT_OF_DATE = "out-of-date database schema"


def _create_or_upgrade(uri: str, db: Path) -> None:
    """Under the store lock: open the store with MLflow's public client, which creates a new
    store's tables and its Default experiment. An existing store is copied first; the copy
    is kept as ``<db>.before-upgrade`` (as MLflow's upgrade advice asks) when the schema
    moved: MLflow migrates a store that lacks one of its tables while opening it, and
    refuses one at an older revision that has them all, which is then upgraded with MLflow's
    own ``mlflow db upgrade`` and opened again."""
    import shutil
    import sqlite3

    import sqlalchemy
    from mlflow.exceptions import MlflowException

    before = _revision(db)  # None: a new store, nothing to keep
    backup = db.with_name(f"{db.name}.before-upgrade")
    copy = backup.with_name(f".{backup.name}.{os.getpid()}") if before is not None else None
    upgrading = False
    try:
        if copy is not None:
            shutil.copyfile(db, copy)
        if not _open_store(uri):
            upgrading = True
            _upgrade(uri)
            if not _open_store(uri):
                raise StoreError(f"{uri}: cannot create or upgrade the MLflow store: the "
                                 "schema is still out of date after `mlflow db upgrade`")
        _mark_ready(db)
    except StoreError:
        raise
    except (sqlalchemy.exc.SQLAlchemyError, MlflowException, OSError, sqlite3.Error) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StoreError(f"{uri}: cannot create or upgrade the MLflow store: {first}") from exc
    finally:
        if copy is not None and copy.exists():
            # Kept when the schema moved, or an upgrade was tried (even part-way): the way
            # back. Otherwise dropped, so an earlier backup is not replaced by a copy of
            # a store that nothing changed.
            if upgrading or _revision(db) != before:
                copy.replace(backup)
            else:
                copy.unlink()


def _revision(db: Path) -> str | None:
    """The schema revision of the MLflow store ``db`` (read-only), None when it has none."""
    import sqlite3

    if not db.is_file() or db.stat().st_size == 0:
        return None
    try:
        connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        try:
            row = connection.execute("SELECT version_num FROM alembic_version").fetchone()
        finally:
            connection.close()
    except sqlite3.Error:
        return None
    return None if row is None else row[0]


def _open_store(uri: str) -> bool:
    """Open the store at ``uri`` with ``MlflowClient`` (its first use creates a new store
    and the Default experiment); False when MLflow refuses it as out of date."""
    from mlflow.exceptions import MlflowException

    try:
        client(uri).get_experiment("0")
    except MlflowException as exc:
        if OUT_OF_DATE in str(exc):
            return False
        raise
    return True


def _upgrade(uri: str) -> None:
    """``mlflow db upgrade URI``, MLflow's public migration command, in a child process."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "mlflow", "db", "upgrade", uri],
                            capture_output=True, text=True, env=subprocess_environment())
    if result.returncode != 0:
        import re

        lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
        # The exception's own line, not SQLAlchemy's "(Background on this error ...)" after it
        errors = [line for line in lines if re.match(r"[\w.]+(Error|Exception)\b", line)]
        cause = (errors or lines or [f"exit status {result.returncode}"])[-1]
        raise StoreError(f"{uri}: cannot create or upgrade the MLflow store: `mlflow db "
                         f"upgrade` failed ({cause[:300]})")


def _probe_http(uri: str, timeout: float) -> None:
    import time
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    problem = "no answer"
    while True:
        remaining = deadline - time.monotonic()
        try:
            with urllib.request.urlopen(f"{uri.rstrip('/')}/health",
                                        timeout=max(0.5, min(remaining, 5.0))) as response:
                if response.status == 200:
                    return
                problem = f"HTTP {response.status} from /health"
        except urllib.error.HTTPError as exc:
            problem = f"HTTP {exc.code} from /health"
        except (OSError, ValueError) as exc:
            problem = str(getattr(exc, "reason", None) or exc)
        if time.monotonic() + 0.5 >= deadline:
            raise StoreError(f"tracking store {uri} is unreachable ({problem}; "
                             f"tried for {timeout:g} s)")
        time.sleep(0.5)
