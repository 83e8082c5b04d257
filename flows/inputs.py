"""Checks of a command's inputs that run before anything is started, contacted or written.

Every ``cord-ops`` command validates its files, options, cron expressions and model names
here first, so a typo costs well under the seconds a Prefect server takes to start and
leaves no store, run or deployment behind. Nothing in this module imports Prefect or
MLflow, and nothing creates the tracking store: a registered model is looked up read-only
in an embedded sqlite store, and only a remote store is asked through ``MlflowClient``
(both in :mod:`flows.store.reads`, which says why).

Each check raises :class:`InputError` with one line that names the file, option or model
and the expectation.
"""

from __future__ import annotations

import math
import re
import sqlite3
import zipfile
from pathlib import Path

from cord_ops.names import CALIBRATOR_CHOICES
from flows.errors import CordOpsError
from flows.files import is_glob
from flows.store import reads as store_reads

CRON_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31),
               ("month", 1, 12), ("day of week", 0, 7))
CRON_NAMES = {
    "month": ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov",
              "dec"],
    "day of week": ["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
}
CRON_ALIASES = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight",
                "@hourly")
CRON_EXAMPLE = '"0 3 * * *" (minute hour day-of-month month day-of-week)'
#: Seconds or minutes by which the default monitoring schedule follows recalibration.
MONITOR_OFFSET_MINUTES = 30
MONITOR_OFFSET_SECONDS = 30
#: Seconds a remote store's /health may take to answer during validation.
STORE_PROBE_TIMEOUT_S = 3.0
#: cord_ops.data.PARQUET_SUFFIXES, restated so this module needs no numpy (a test keeps
#: the two equal).
PARQUET_SUFFIXES = (".parquet", ".pq")
#: Evaluation rows a recalibration on shards gathers to the driver at most (ONNX parity, the
#: pinned reference split, the gate's scores, ECE-EM, smECE, plots, the input example).
DEFAULT_EVAL_SAMPLE = 50_000


class InputError(CordOpsError, ValueError):
    """A bad command input; the message is the whole one-line explanation."""


# ---------------------------------------------------------------- files and options
def existing_file(path: Path | str | None, option: str) -> Path | None:
    """``path`` if it is a readable file (None passes through); checked before numpy is
    even imported, so a typo'd name fails at once."""
    if path is None:
        return None
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file (given as {option})")
    if not path.is_file():
        raise InputError(f"{path}: is not a file (given as {option})")
    return path


def data_file(path: Path | str | None, option: str) -> Path | None:
    """``path`` if it is a file that can be an .npz archive (a zip) or, by its suffix
    .parquet/.pq, a Parquet file (``PAR1`` at both ends); None passes through. Only the
    container is checked here, without numpy: :func:`load_data` reads the contents."""
    path = existing_file(path, option)
    if path is None:
        return None
    if path.suffix.lower() in PARQUET_SUFFIXES:
        with open(path, "rb") as handle:
            head = handle.read(4)
            handle.seek(max(0, path.stat().st_size - 4))
            tail = handle.read(4)
        if head != b"PAR1" or tail != b"PAR1":
            raise InputError(f"{path}: not a Parquet file (no PAR1 magic); expected the "
                             f"columns of docs/data-formats.md (given as {option})")
        return path
    with open(path, "rb") as handle:
        head = handle.read(6)
    if head != b"\x93NUMPY" and not zipfile.is_zipfile(path):
        raise InputError(f"{path}: not an .npz archive (numpy.savez's zip of .npy arrays); "
                         f"expected 'logits' or 'probs' and 'labels' (given as {option})")
    return path


def load_data(path: Path, input_kind: str = "auto"):
    """The validated dataset in ``path`` (see :func:`cord_ops.data.load`: .npz or Parquet)."""
    from cord_ops import data

    try:
        return data.load(path, input_kind=input_kind)
    except (ValueError, TypeError, OSError) as exc:
        raise InputError(str(exc)) from exc


def is_batch_input(spec) -> bool:
    """Whether an --input is a folder or a glob pattern (batch mode), not one file."""
    text = str(spec)
    return is_glob(text) or Path(text).is_dir()


def new_folder(path: Path, option: str) -> Path:
    """An output folder that does not exist yet, in a folder that does."""
    if path.exists():
        raise InputError(f"{path}: already exists; batch output goes to a new folder "
                         f"(given as {option})")
    if not path.resolve().parent.is_dir():
        raise InputError(f"{path}: folder {path.resolve().parent} does not exist "
                         f"(given as {option})")
    return path


def check_recalibration(dataset, eval_dataset, calibrator: str, fraction: float, seed: int,
                        gate_options: dict | None = None,
                        decision_threshold: float | None = None):
    """The options a recalibration of ``dataset`` would refuse, refused now: an evaluation
    file with other classes or another input kind, a seed or fraction the split rejects,
    splits too small to fit, a gate threshold out of range, a calibrator that cannot read
    the file's input kind, a decision threshold for a model that is not binary. Returns the
    gate's policy (:class:`flows.promotion.rules.Policy`).

    The recalibration flow's own ``check_options`` task runs this same check.
    """
    from cord_ops import data
    from cord_ops.threshold import check_threshold
    from flows.promotion import rules

    if eval_dataset is not None:
        if eval_dataset.n_classes != dataset.n_classes:
            raise InputError(f"{eval_dataset.path}: has {eval_dataset.n_classes} classes but "
                             f"{dataset.path} has {dataset.n_classes}")
        if eval_dataset.input_kind != dataset.input_kind:
            raise InputError(f"{eval_dataset.path}: holds {eval_dataset.input_kind} but "
                             f"{dataset.path} holds {dataset.input_kind}")
    try:
        if eval_dataset is None:
            cal_rows, eval_rows = data.split_indices(dataset.n, seed, fraction)
            sizes = (cal_rows.size, eval_rows.size, f"{dataset.path} (split with fraction "
                                                    f"{fraction!r})")
        else:
            sizes = (dataset.n, eval_dataset.n, f"{dataset.path} / {eval_dataset.path}")
    except ValueError as exc:
        raise InputError(f"{dataset.path}: {exc}") from exc
    try:
        policy = rules.Policy.for_classes(dataset.n_classes, **(gate_options or {}))
        rules.check_fit_floor(*sizes)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    try:
        check_threshold(decision_threshold, dataset.n_classes)
    except ValueError as exc:
        raise InputError(f"{dataset.path}: --{exc}".replace("decision_threshold",
                                                            "decision-threshold", 1)) from exc
    # By name, not by building one: that would import scikit-learn (seconds on a busy
    # machine) in a check meant to answer at once. Every family reads both input kinds.
    if calibrator not in CALIBRATOR_CHOICES:
        raise InputError(f"calibrator {calibrator!r}: expected one of "
                         f"{', '.join(CALIBRATOR_CHOICES)}")
    return policy


def shard_options(calibrator: str, eval_sample: int) -> None:
    """A calibrator that cannot be fitted from partition sums is refused naming the ones
    that can; the evaluation sample must hold a row (no imports: checked first)."""
    from cord_ops.names import AUTO, REDUCIBLE

    if calibrator == AUTO:
        # Choosing needs every candidate fitted k times on held-out folds; on shards only
        # TS and VS reduce over partitions, so auto is refused rather than half-done.
        raise InputError(f"--calibrator auto (the default): not supported on shards (the choice "
                         f"cross-validates families that need every row in one process); "
                         f"name one of {', '.join(REDUCIBLE)}")
    if calibrator not in REDUCIBLE:
        raise InputError(f"--calibrator {calibrator}: cannot be fitted on shards (it needs "
                         f"every row in one process); expected one of {', '.join(REDUCIBLE)}")
    if isinstance(eval_sample, bool) or not isinstance(eval_sample, int) or eval_sample < 1:
        raise InputError(f"--eval-sample: expected a positive integer, got {eval_sample!r}")


def check_shard_recalibration(plan, calibrator: str, eval_sample: int,
                              gate_options: dict | None = None):
    """:func:`check_recalibration` for a :class:`flows.shards.plan.ShardPlan`:
    :func:`shard_options`, then the gate's thresholds and the split sizes (the plan's
    exact counts). Returns the gate's policy."""
    from flows.promotion import rules

    shard_options(calibrator, eval_sample)
    where = plan.data.path if plan.evaluation is None else (
        f"{plan.data.path} / {plan.evaluation.path}")
    try:
        policy = rules.Policy.for_classes(plan.n_classes, **(gate_options or {}))
        rules.check_fit_floor(plan.n_calibration, plan.n_evaluation, where)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    return policy


def dask_scheduler(address: str | None, option: str = "--dask-address") -> str | None:
    """``address`` if it is ``[tcp://]host:port`` and something listens there (a socket
    connect, a few seconds at most); None passes through."""
    import socket
    from urllib.parse import urlsplit

    if address is None:
        return None
    text = address if "://" in address else f"tcp://{address}"
    try:
        parts = urlsplit(text)
        scheme, host, port = parts.scheme, parts.hostname, parts.port
    except ValueError:  # a port that is not a number
        scheme = host = port = None
    if scheme not in ("tcp", "tls") or not host or port is None:
        raise InputError(f"{option} {address!r}: expected a Dask scheduler address "
                         "tcp://HOST:PORT")
    try:
        with socket.create_connection((host, port), timeout=STORE_PROBE_TIMEOUT_S):
            pass
    except OSError as exc:
        raise InputError(f"{option} {address}: no Dask scheduler answers there ({exc})") from None
    return text


def non_negative(value: float, option: str) -> float:
    if not (math.isfinite(value) and value >= 0):
        raise InputError(f"{option}: expected a finite number >= 0, got {value!r}")
    return value


#: The ports a server of ours may be told to listen on: the port its start-up line prints
#: is the one clients use, so 0 (a port the system picks when the socket is bound) is
#: refused rather than printed as ``:0``.
PORTS = (1, 65535)


def listen_port(port: int, option: str = "--port") -> int:
    """``port`` if ``cord-ops ui`` and ``cord-ops serve`` (and :func:`flows.serve.app.serve`)
    may listen on it: an integer in :data:`PORTS`. The one port rule of the command line
    and the library."""
    low, high = PORTS
    if not low <= port <= high:
        raise InputError(f"{option}: expected {low}-{high}, got {port!r}")
    return port


def fraction_in_unit_interval(value: float, option: str = "--fraction") -> float:
    if not 0.0 < value < 1.0:
        raise InputError(f"{option}: expected a calibration share in (0, 1), got {value!r}")
    return value


def writable_output(path: Path, option: str, *inputs: Path | None,
                    overwrite: bool = False) -> Path:
    """An output path whose folder exists, that is not one of the inputs, and that does
    not exist unless ``overwrite`` (``--overwrite``) says to replace it."""
    folder = path.resolve().parent
    if not folder.is_dir():
        raise InputError(f"{path}: folder {folder} does not exist (given as {option})")
    if path.is_dir():
        raise InputError(f"{path}: is a folder; expected a file name (given as {option})")
    for source in inputs:
        if source is not None and source.exists() and path.exists() and path.samefile(source):
            raise InputError(f"{path}: is also the input; choose another {option}")
    if not overwrite and (path.exists() or path.is_symlink()):
        raise InputError(f"{path}: already exists; pass --overwrite to replace it, or choose "
                         f"another {option}")
    return path


# ---------------------------------------------------------------- cron
def _cron_value(token: str, field: str, low: int, high: int, where: str) -> int:
    names = CRON_NAMES.get(field)
    if names and token.lower() in names:
        return names.index(token.lower()) + (1 if field == "month" else 0)
    if not token.isdigit() or not low <= int(token) <= high:
        raise InputError(f"{where}: {field} {token!r} is not in {low}-{high}; expected "
                         f"{CRON_EXAMPLE}")
    return int(token)


def check_cron(cron: str, option: str = "--cron") -> str:
    """``cron`` if it is a 5-field cron expression (numbers, ``*``, ranges ``a-b``, lists
    ``a,b``, steps ``/n``, month and weekday names) or an alias such as ``@daily``.

    Prefect's own parser accepts a few extensions (``L``, ``#``, a seconds field); this
    stricter check keeps the common grammar and fails in one line without importing
    Prefect.
    """
    text = " ".join(cron.split())
    if text.lower() in CRON_ALIASES:
        return text.lower()
    fields = text.split(" ") if text else []
    if len(fields) != len(CRON_FIELDS):
        raise InputError(f"{option} {cron!r}: has {len(fields)} fields; expected {CRON_EXAMPLE}")
    for value, (field, low, high) in zip(fields, CRON_FIELDS, strict=True):
        for item in value.split(","):
            base, _, step = item.partition("/")
            if step and (not step.isdigit() or int(step) == 0):
                raise InputError(f"{option} {cron!r}: {field} step {step!r} is not a positive "
                                 f"integer; expected {CRON_EXAMPLE}")
            if base in ("*", "?") and (base == "*" or field in ("day of month", "day of week")):
                continue
            first, dash, last = base.partition("-")
            if step and not dash:
                raise InputError(f"{option} {cron!r}: {field} step '{item}' needs * or a range "
                                 f"before it (e.g. */15 or 0-30/15); expected {CRON_EXAMPLE}")
            where = f"{option} {cron!r}"
            start = _cron_value(first, field, low, high, where)
            if dash and _cron_value(last, field, low, high, where) < start:
                raise InputError(f"{option} {cron!r}: {field} range {base!r} runs backwards")
            if dash and field == "day of week" and start == 7:
                # Prefect's parser reads 7-7 as every day; Sunday starts a range as 0.
                raise InputError(f"{option} {cron!r}: day of week range {base!r} starts at 7; "
                                 "write Sunday as 0 at the start of a range")
    return text


def monitor_cron_for(cron: str) -> str:
    """The default monitoring schedule: ``cron`` shifted so monitoring never starts at
    the same moment as the recalibration it watches, and follows it within the hour.

    A minute field that is one number below 30 moves :data:`MONITOR_OFFSET_MINUTES` later
    (``0 3 * * *`` -> ``30 3 * * *``). Any other (``45``, ``*``, ``*/5``, lists, an alias's
    expansion) keeps its minutes and gains a seconds field (Prefect's cron takes a sixth,
    seconds, field): ``* * * * *`` -> ``* * * * * 30``, 30 s after each recalibration
    starts. (Shifting past the hour would move the hour field, and with it days.)
    """
    cron = check_cron(cron)
    aliases = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
               "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
               "@hourly": "0 * * * *"}
    fields = aliases.get(cron, cron).split(" ")
    if re.fullmatch(r"\d+", fields[0]) and int(fields[0]) + MONITOR_OFFSET_MINUTES < 60:
        fields[0] = str(int(fields[0]) + MONITOR_OFFSET_MINUTES)
        return " ".join(fields)
    # Prefect's cron parser refuses a Sunday written as 7 once a seconds field follows
    # ("* * * * 7 30"), so such a day-of-week field is spelled out with 0 instead.
    fields[4] = _sunday_as_zero(fields[4])
    return " ".join([*fields, str(MONITOR_OFFSET_SECONDS)])


def _sunday_as_zero(field: str) -> str:
    """A day-of-week field with every item that reaches 7 replaced by its days as numbers
    0-6 (``5-7`` -> ``5,6,0``, ``0-7/2`` -> ``0,2,4,6``); other items are kept as written."""
    items = []
    for item in field.split(","):
        base, _, step = item.partition("/")
        if base in ("*", "?"):
            items.append(item)
            continue
        first, _, last = base.partition("-")
        low = _cron_value(first, "day of week", 0, 7, "day of week")
        high = _cron_value(last, "day of week", 0, 7, "day of week") if last else low
        if high == 7:
            items.extend(str(day % 7) for day in range(low, 8, int(step) if step else 1))
        else:
            items.append(item)
    return ",".join(dict.fromkeys(items))


# ---------------------------------------------------------------- the tracking store
def existing_store(uri: str) -> str:
    """``uri`` if its store exists; for an embedded store, its database file must be there
    (a read must never create an empty store somewhere else)."""
    database = store_reads.embedded_database(uri)
    if database is not None and not database.is_file():
        raise InputError(
            f"no MLflow store at {uri}: the default store is ./mlruns/mlflow.db in the "
            "working folder; run from the folder that holds it, or pass --tracking-uri "
            "(or set MLFLOW_TRACKING_URI)")
    if uri.startswith(("http://", "https://")):
        from flows.store import tracking

        # A server that is down fails here in seconds, not after a client's retries.
        try:
            tracking.prepare_store(uri, STORE_PROBE_TIMEOUT_S)
        except tracking.StoreError as exc:
            raise InputError(str(exc)) from None
    return uri


def registered_model(uri: str, name: str, alias: str | None = None) -> None:
    """Check that model ``name`` (and its ``@alias`` when given) is registered in the
    store ``uri``; the error names the store and the models it does hold."""
    existing_store(uri)
    try:
        names, found = store_reads.registered_names(uri, name, alias)
    except sqlite3.DatabaseError as exc:
        raise InputError(f"{uri}: cannot read the MLflow store ({exc})") from exc
    if found:
        return
    if name not in names:
        held = ", ".join(names) if names else "none"
        raise InputError(f"model '{name}' is not registered in {uri} (registered: {held})")
    raise InputError(missing_alias(uri, name, alias))


def missing_alias(uri: str, name: str, alias: str) -> str:
    """Why registered model ``name`` has no ``@alias`` in store ``uri``, and the next right
    step: recalibrate when it has no version; for ``@champion``, the newest version's
    refusal as the gate recorded it and the ``promote`` that overrides it (naming
    ``--allow-harm`` where the version is worse than the uncalibrated model); for any other
    alias, the aliases that exist."""
    from flows.store import registry

    try:
        state = store_reads.model_state(uri, name)
    except sqlite3.DatabaseError:
        state = None
    head = f"model '{name}' has no @{alias} in {uri}"
    if state is None or not state["versions"]:
        return f"{head}: it has no version yet; run `cord-ops recalibrate --model-name {name}`"
    if alias != registry.CHAMPION:
        held = ", ".join(f"@{a} (v{v})" for a, v in sorted(state["aliases"].items()))
        return f"{head}; its aliases: {held or 'none'} (versions: {', '.join(state['versions'])})"
    complete = [v for v, tags in state["versions"].items()
                if tags.get(registry.REGISTRATION_TAG) == registry.COMPLETE]
    if not complete:
        return (f"{head}: no version finished registration (versions: "
                f"{', '.join(state['versions'])}); run `cord-ops recalibrate --model-name "
                f"{name}`")
    newest = max(complete, key=int)
    tags = state["versions"][newest]
    return f"{head}: {refusal_and_next_step(name, newest, tags)}"


def refusal_and_next_step(name: str, version: str, tags) -> str:
    """Why version ``version`` (registry ``tags``) does not hold ``@champion`` and the
    command that would make it serve: the gate's recorded reason, then ``promote``, with
    ``--allow-harm`` and the words that it is worse than the uncalibrated model when the
    gate found it so."""
    from flows.promotion import guards
    from flows.store import registry

    reason = tags.get(registry.REASON_TAG) or "no gate decision recorded"
    command = (f"`cord-ops promote --model-name {name} --version {version} --reason TEXT"
               + (" --allow-harm`" if guards.harms(tags) else "`"))
    if tags.get(registry.DECISION_TAG) == "promoted":
        return (f"the gate promoted v{version}, and @{registry.CHAMPION} was removed since; "
                f"to serve it again: {command}")
    if guards.harms(tags):
        return (f"v{version} was not promoted ({reason}); the uncalibrated classifier is "
                f"better on that split: keep serving it or recalibrate with another "
                f"--calibrator, or override with {command}")
    return f"v{version} was not promoted ({reason}); to serve it anyway: {command}"


def champion_reads(uri: str, name: str, dataset) -> None:
    """When ``name`` has a champion in the store ``uri``, ``dataset`` must have its number
    of classes and input kind: the gate scores the champion on the new data, and a
    monitored batch is scored by it. A store that does not exist yet has no champion."""
    from flows.store.registry import CHAMPION, INPUT_KIND_TAG

    database = store_reads.embedded_database(uri)
    if database is not None and not database.is_file():
        return
    try:
        champion = store_reads.version_reads(existing_store(uri) if database is None else uri,
                                             name, CHAMPION, None)
    except sqlite3.DatabaseError:
        return  # not readable as an MLflow store: the store's own check reports it
    if champion is None:
        return
    reads = champion["tags"].get(INPUT_KIND_TAG)
    classes = champion["n_classes"]
    if classes is not None and int(classes) != dataset.n_classes:
        raise InputError(f"{dataset.path}: has {dataset.n_classes} classes but '{name}'"
                         f"@champion (v{champion['version']} in {uri}) reads {classes}; "
                         "use another --model-name for another classifier")
    if reads is not None and reads != dataset.input_kind:
        raise InputError(f"{dataset.path}: holds {dataset.input_kind} but '{name}'@champion "
                         f"(v{champion['version']} in {uri}) reads {reads}")


def model_reads(uri: str, model: str) -> tuple[int, str, str] | None:
    """(K, input kind, what was read) of the model ``--model`` names, read cheaply: a local
    .onnx file's metadata, or the registered version's run params and input-kind tag (read
    only from an embedded store, as :func:`registered_model` does, else through MLflow's
    public client). None when it cannot be told without loading the model
    (``runs:/`` and other artifact URIs); the model's own load then checks the input."""
    from flows.store.registry import INPUT_KIND_TAG

    if ":/" not in model:
        import onnx

        try:
            meta = {p.key: p.value for p in onnx.load(model, load_external_data=False)
                    .metadata_props}
            return int(meta["cord.n_classes"]), meta["cord.input_kind"], model
        except Exception:  # not readable as ONNX: the model's own load says what is wrong
            return None
    if not model.startswith("models:/"):
        return None
    name, alias, version = _parse_model_uri(model)
    try:
        found = store_reads.version_reads(uri, name, alias, version)
    except sqlite3.DatabaseError:
        return None
    if found is None or found["n_classes"] is None:
        return None
    kind = found["tags"].get(INPUT_KIND_TAG) or found["input_kind"]
    if kind is None:
        return None
    return int(found["n_classes"]), kind, f"'{name}' v{found['version']}"


def _parse_model_uri(model: str) -> tuple[str, str | None, str | None]:
    reference = model.removeprefix("models:/").strip("/")
    if "@" in reference:
        name, _, alias = reference.partition("@")
        return name, alias, None
    name, _, version = reference.partition("/")
    return name, None, version


def scoring_file(path, reads: tuple[int, str, str] | None, option: str) -> None:
    """An input to score must hold what the model reads (K columns, or one for a binary
    model; finite; probability rows for a probability model): checked here, before the
    model is downloaded and its session opened, with the load rule ``predict`` itself
    applies (:func:`cord_ops.scoring_files.read_any_input`)."""
    if reads is None:
        return
    import numpy as np

    from cord_ops.scoring_files import read_any_input

    n_classes, input_kind, source = reads
    try:
        read_any_input(path, n_classes, input_kind, np.dtype(np.float64))
    except (ValueError, TypeError) as exc:
        raise InputError(f"{exc} (given as {option}; {source} reads {n_classes} classes of "
                         f"{input_kind})") from exc


def model_reference(uri: str, model: str) -> None:
    """A ``--model`` given as a path (must be a file) or as ``models:/NAME@ALIAS`` /
    ``models:/NAME/VERSION`` (must be registered in ``uri``)."""
    if ":/" not in model:
        existing_file(model, "--model")
        return
    if not model.startswith("models:/"):
        existing_store(uri)  # runs:/ and other artifact URIs are resolved by MLflow
        return
    reference = model.removeprefix("models:/").strip("/")
    if "@" in reference:
        name, _, alias = reference.partition("@")
        registered_model(uri, name, alias)
    else:
        name, _, version = reference.partition("/")
        registered_model(uri, name)
        if version and not version.isdigit():
            raise InputError(f"--model {model}: version {version!r} is not a number; expected "
                             "models:/NAME@ALIAS or models:/NAME/VERSION")
