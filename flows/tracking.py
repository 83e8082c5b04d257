"""Where runs and models are recorded: the embedded default MLflow store, or the one
MLFLOW_TRACKING_URI names.

The embedded default is ``sqlite:///<cwd>/mlruns/mlflow.db`` with artifacts under
``<cwd>/mlruns/`` (MLflow 3 keeps the plain file store in maintenance mode, so the
registry needs a database). Telemetry is switched off before MLflow or Prefect are
imported anywhere in the process.
"""

from __future__ import annotations

import os
from pathlib import Path

STORE_DIR = "mlruns"
DB_NAME = "mlflow.db"

#: Environment that keeps MLflow and Prefect from phoning home; set with setdefault so
#: a user's explicit choice wins.
QUIET_ENVIRONMENT = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
}


def disable_telemetry() -> None:
    """Switch off MLflow and Prefect telemetry for this process and its children."""
    for key, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(key, value)


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


def configure_tracking(uri: str | None = None) -> str:
    """Point MLflow at :func:`tracking_uri` and return the URI; the registry follows it.

    For a local sqlite store the folder is created first so the first run needs no setup.
    """
    disable_telemetry()
    import mlflow

    uri = uri or tracking_uri()
    if is_embedded(uri):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    return uri


def experiment_id(name: str) -> str:
    """The id of experiment ``name``, created on first use.

    In the embedded store MLflow places a new experiment's artifacts under ``./mlruns/<id>``.
    """
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient()
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException:
        # Another process created it between the lookup and the create.
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


# ---------------------------------------------------------------- store preparation
#: Default bound, in seconds, on how long a command may spend failing against a store that
#: is down (``--store-timeout``).
DEFAULT_STORE_TIMEOUT = 60.0
#: Where in a local store folder the store-creation lock lives (beside the registry locks).
STORE_LOCK = Path(".cord-locks") / "store.lock"
SQLITE_HEADER = b"SQLite format 3\x00"


class StoreError(RuntimeError):
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

    The Prefect tasks do not retry what these already retried (see :mod:`flows.retries`),
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
    """True when ``db`` is an MLflow store at the schema this MLflow expects, with its
    Default experiment: nothing to create or upgrade. Read-only."""
    import sqlite3

    from mlflow.store.db.utils import _get_latest_schema_revision

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
    return revision == _get_latest_schema_revision() and default is not None


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


def _create_or_upgrade(uri: str, db: Path) -> None:
    import shutil

    import sqlalchemy
    from mlflow.exceptions import MlflowException
    from mlflow.store.db import utils

    engine = utils.create_sqlalchemy_engine(uri)
    try:
        tables = set(sqlalchemy.inspect(engine).get_table_names())
        if tables and "experiments" not in tables:
            raise StoreError(f"{uri}: {db} is an SQLite database but not an MLflow store "
                             f"(tables: {', '.join(sorted(tables)[:5])})")
        if not utils._all_tables_exist(engine):
            # A new store (or one whose creation was interrupted): MLflow's own creation.
            utils._initialize_tables(engine)
        elif utils._get_schema_version(engine) != utils._get_latest_schema_revision():
            # Keep the pre-upgrade database, as MLflow's upgrade advice asks.
            shutil.copyfile(db, db.with_name(f"{db.name}.before-upgrade"))
            utils._upgrade_db(engine)
    except StoreError:
        raise
    except (sqlalchemy.exc.SQLAlchemyError, MlflowException, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StoreError(f"{uri}: cannot create or upgrade the MLflow store: {first}") from exc
    finally:
        engine.dispose()
    # The Default experiment is inserted on first open; do it here, still under the lock.
    from mlflow import MlflowClient

    MlflowClient(uri).get_experiment("0")


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
