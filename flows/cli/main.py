"""The ``cord-ops`` command line: recalibrate, monitor, schedule, predict, demo, ui, server
(and reproduce / bench from :mod:`flows.reproduce.cli`, status / promote / rollback from
:mod:`flows.cli.operator`).

How every command runs (:func:`run`):

1. ``validate``: the command's own check of its files, keys, shapes, classes, options,
   cron expressions and model names (:mod:`flows.inputs`). Nothing is started, contacted
   or written before it passes, so a bad input exits in about a second.
2. The command, against the Prefect server ``PREFECT_API_URL`` names, else the local
   server cord-ops manages (:mod:`flows.platform.managed_server`) when it is running, else Prefect's
   temporary per-command server. MLflow is used through the tracking URI resolved once
   (``--tracking-uri``, else ``MLFLOW_TRACKING_URI``, else ``./mlruns/mlflow.db``) and
   handed down explicitly.
3. Exit status 0, or 1 with one ``error:`` line as the last line of output; a traceback
   only with ``--verbose``. An error that involves the store names its tracking URI.

Prefect, MLflow and onnxruntime are imported inside the command that needs them, not when
the parser is built.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import shlex
import signal
import sys
import time
import traceback
from pathlib import Path

from flows import inputs
from flows.cli import label_free as label_free_cli
from flows.cli import operator as operator_cli
from flows.cli import parser as cli_parser
from flows.cli import rollout as rollout_cli
from flows.errors import CordOpsError, in_words
from flows.platform import credential, tick_lines, warm
from flows.platform import managed_server as server
from flows.redact import PASSWORD_ENV, USERNAME_ENV, credentials_to_environment, redact
from flows.store import owner, tracking

SUMMARY_METRICS = (("ECE", "ece"), ("NLL", "nll"), ("Brier", "brier"),
                   ("accuracy", "accuracy"), ("TPCR", "tpcr"))
#: Exit status of ``server status`` when no managed server runs (as ``systemctl status``).
NOT_RUNNING = 3
#: The umask (octal) for what cord-ops creates, when not owner-only (:func:`private_umask`).
UMASK_ENV = "CORD_OPS_UMASK"
#: Packages whose exceptions mean the tracking store failed (their errors name the URI).
STORE_PACKAGES = ("mlflow", "sqlalchemy", "sqlite3", "requests", "urllib3", "alembic")


def _error(message: str) -> int:
    print(f"error: {redact(message)}", file=sys.stderr, flush=True)
    return 1


# ---------------------------------------------------------------- output
def summary_table(result) -> str:
    """The closing table: uncal / base / cord by ECE, NLL, Brier, accuracy, TPCR, and eta*."""
    header = f"{'report':<8}" + "".join(f"{title:>11}" for title, _ in SUMMARY_METRICS)
    lines = [header, "-" * len(header)]
    uncal = result.reports["uncal"]["nll"]
    for report in ("uncal", "base", "cord"):
        values = result.reports[report]
        # Worse than the classifier itself beyond rounding (the gate's 1e-6 relative).
        harm = report != "uncal" and values["nll"] > uncal + 1e-6 * abs(uncal)
        lines.append(f"{report:<8}" + "".join(f"{values[key]:>11.5f}"
                                              for _, key in SUMMARY_METRICS)
                     + ("  ! NLL worse than uncal" if harm else ""))
    lines.append(f"eta* = {result.eta_star!r}")
    return "\n".join(lines)


def predict_hint(data) -> str:
    """``--input ... --output ...`` of the suggested ``predict``, of the kind the run read:
    a folder or glob of shards scores into a new folder, a Parquet file into Parquet."""
    if data is not None and inputs.is_batch_input(data):
        return "--input FOLDER --output NEW_FOLDER"
    if data is not None and Path(str(data)).suffix.lower() in (".parquet", ".pq"):
        return "--input FILE.parquet --output OUT.parquet"
    return "--input FILE.npz --output OUT.npz"


def next_steps(result, total_seconds: float, data=None) -> str:
    """Where the run, the model and the timings are, and what to run next (``data``: what
    the run read, so the suggested ``predict`` takes the same kind of input)."""
    decision = result.decision
    alias = (f"-> {result.model_name}@champion" if decision.promote
             else f"(@champion unchanged: {decision.reason})")
    compute = sum(result.timings.values())
    return "\n".join([
        f"gate:     v{result.version} {decision.label} {alias}",
        f"          candidate NLL {decision.candidate_nll:.6g}, champion NLL "
        f"{'-' if decision.champion_nll is None else f'{decision.champion_nll:.6g}'}",
        *_reference_line(decision),
        *_repair_lines(result),
        *_warning_lines(result),
        *[f"{'input:' if i == 0 else '':<10}{note}"
          for i, note in enumerate(getattr(result, "input_notes", None) or [])],
        f"onnx:     max |onnx - cord_ops| = {result.onnx_max_abs_diff:.3g}",
        f"time:     {total_seconds:.1f} s total, {compute:.1f} s in flow tasks, "
        f"{total_seconds - compute:.1f} s start-up and orchestration",
        f"tracking: {result.tracking_uri} (run {result.run_id})",
        "next:     cord-ops ui    # browse runs, metrics, reliability diagrams",
        *_serving_step(result, data),
    ])


def _serving_step(result, data) -> list[str]:
    """The ``predict`` to run next, or, when the model has no champion after this run,
    why not and the ``promote`` that would make this version serve."""
    decision = result.decision
    if decision.promote or decision.champion_version is not None:
        return [f"          cord-ops predict --model models:/{result.model_name}@champion "
                f"{predict_hint(data)}"]
    from flows.store import registry

    tags = {registry.REASON_TAG: decision.reason, registry.DECISION_TAG: decision.label,
            registry.HARMS_TAG: str(bool(decision.harms)).lower()}
    return [f"          no @champion yet: "
            f"{inputs.refusal_and_next_step(result.model_name, str(result.version), tags)}"]


def _reference_line(decision) -> list[str]:
    ref = decision.reference
    if ref is None:
        return []
    if ref.problem:
        return [f"          champion v{ref.version}'s reference split not used: {ref.problem}"]
    return [f"          on champion v{ref.version}'s reference split: candidate NLL "
            f"{ref.candidate_nll:.6g}, champion NLL {ref.champion_nll:.6g}"]


def _repair_lines(result) -> list[str]:
    """What the CORD repair did on the evaluation split (issue 44): rows moved, pinned onto
    the decision boundary, made one constant, and a binary model's AUC before and after."""
    effect = getattr(result, "repair", None) or {}
    if not effect:
        return []
    t = getattr(result, "decision_threshold", None)
    boundary = "the decision boundary" if t is None else f"the threshold p1 = {t:g}"
    line = (f"repair:   moved {effect['moved_share']:.1%} of the outputs, "
            f"{effect['boundary_share']:.1%} onto {boundary}")
    if effect["flat_share"] > 0:
        line += f", {effect['flat_share']:.1%} to one value {effect['flat_value']!r}"
    lines = [line]
    if t is not None:
        lines.append(f"          decisions kept at p1 >= {t:g} (label, accuracy and TPCR are "
                     "of those decisions)")
    if "auc_uncal" in effect:
        lines.append(f"          AUC {effect['auc_uncal']:.4f} uncalibrated, "
                     f"{effect['auc_base']:.4f} calibrated, {effect['auc_cord']:.4f} "
                     "after CORD")
    return lines


def _warning_lines(result) -> list[str]:
    found = getattr(result, "warnings", None) or []
    return [f"{'warnings:' if i == 0 else '':<10}{text}" for i, text in enumerate(found)]


def _print_result(result, started: float, data=None) -> None:
    print()
    if getattr(result, "skipped", None):
        print(f"skipped:  {result.skipped}")
        print(f"tracking: {result.tracking_uri} (run {result.run_id})")
        return
    print(summary_table(result))
    print()
    chosen = selection_lines(result)
    if chosen:
        print("\n".join(chosen))
        print()
    print(next_steps(result, time.perf_counter() - started, data))


def selection_lines(result) -> list[str]:
    """The family fitted and how it was chosen; when it was cross-validated, every
    candidate best first, the fitted one marked ``*`` (:mod:`flows.recalibrate.selection`)."""
    choice = getattr(result, "choice", None)
    if choice is None:
        return []
    lines = [f"family:   {choice.family} ({choice.how})"]
    if choice.selection is not None:
        table = choice.selection.table().splitlines()
        # The table marks the cross-validation's choice; after a fall-back, identity's row.
        lines += ["          " + (("*" + line[1:]) if line[2:].split()[:1] == [choice.family]
                                 else (" " + line[1:])) for line in table]
    return lines


def _server_hint(args) -> str:
    """The command that stops the managed server of this store."""
    store = "" if args.tracking_uri_given is None else f"--tracking-uri {args.tracking_uri} "
    return f"cord-ops {store}server stop"


# ---------------------------------------------------------------- Prefect
@contextlib.contextmanager
def prefect_api(args, start_managed: bool = False):
    """Run the body against one Prefect API; yields the managed server in use, or None.

    ``PREFECT_API_URL`` (environment or Prefect profile) wins, and must answer. Otherwise
    the managed server of this store is used when it is running, or started when
    ``start_managed``; failing both, a temporary server that dies with this process
    (:func:`flows.platform.temporary_server.temporary_api`). The managed server's URL and
    credential are set for the body through Prefect's settings context (this process's
    environment is untouched) and are inherited by the flow-run processes Prefect starts.
    """
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    from flows.platform import temporary_server as prefect_server

    configured = prefect_server.configured_api_url()
    if configured:
        if not server.healthy(configured, auth=PREFECT_API_AUTH_STRING.value()):
            raise server.ServerError(f"the Prefect server PREFECT_API_URL={configured} does "
                                     "not answer")
        yield None
        return
    folder = server.state_folder(args.tracking_uri)
    managed = server.running(folder)
    if managed is None and start_managed:
        managed, started = server.start(folder)
        print(f"{'started' if started else 'using'} {managed.describe()}", flush=True)
    if managed is None:
        with prefect_server.temporary_api():
            try:
                yield None
            finally:
                _drain_prefect_workers()
        return
    with temporary_settings(updates={PREFECT_API_URL: managed.api_url,
                                     PREFECT_API_AUTH_STRING: managed.auth}):
        yield managed


def _drain_prefect_workers(timeout: float = 10.0) -> None:
    """Send the logs and events Prefect still queues while the temporary server is up;
    left to Prefect's exit hook, they would meet a stopped server and print a connection
    error after the command's last line."""
    from prefect._internal.concurrency.services import QueueService

    QueueService.drain_all(timeout=timeout, at_exit=False)


@contextlib.contextmanager
def flow_context(args, start_managed: bool = False):
    """What a command that runs flows needs, after its inputs passed: the store made ready
    (created or upgraded once, under a lock: :func:`flows.store.tracking.prepare_store`), a
    Prefect API (:func:`prefect_api`), the registry lock's kind for it (``args.lock``) and
    Prefect's console log without tracebacks unless ``--verbose``. Yields the managed
    server in use, or None."""
    from flows.platform import temporary_server as prefect_server
    from flows.store import lock

    timeout = getattr(args, "store_timeout", tracking.DEFAULT_STORE_TIMEOUT)
    tracking.prepare_store(args.tracking_uri, timeout)
    with prefect_api(args, start_managed) as managed:
        # A temporary server serves this process only, so it cannot serialise anything.
        api = prefect_server.configured_api_url() or (managed and managed.api_url)
        args.lock = lock.choose(tracking.local_store_folder(args.tracking_uri), api)
        with console_tracebacks(args.verbose):
            yield managed


class _WithoutTraceback(logging.Formatter):
    """Formats like ``inner`` but leaves out exception and stack text."""

    def __init__(self, inner: logging.Formatter | None):
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info = record.exc_text = record.stack_info = None
        try:
            return self.inner.format(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved


@contextlib.contextmanager
def console_tracebacks(verbose: bool):
    """Without ``verbose``, Prefect's console log lines keep their message but drop the
    traceback (the log sent to the Prefect API keeps it); restored afterwards."""
    swapped = []
    if not verbose:
        import prefect.main  # noqa: F401  (sets up Prefect's log handlers, as any flow import does)

        loggers = [logging.getLogger()] + [
            logger for name, logger in logging.Logger.manager.loggerDict.items()
            if name.startswith("prefect") and isinstance(logger, logging.Logger)]
        for logger in loggers:
            for handler in logger.handlers:
                if type(handler).__name__ == "PrefectConsoleHandler" and not any(
                        handler is h for h, _ in swapped):
                    swapped.append((handler, handler.formatter))
                    handler.setFormatter(_WithoutTraceback(handler.formatter))
    try:
        yield
    finally:
        for handler, formatter in swapped:
            handler.setFormatter(formatter)


# ---------------------------------------------------------------- validation
def _check_flow_options(args) -> None:
    inputs.fraction_in_unit_interval(args.fraction)
    if args.seed < 0:
        raise inputs.InputError(f"--seed: expected a non-negative integer, got {args.seed}")
    budget = getattr(args, "select_budget", None)
    if budget is not None and not (budget > 0 and math.isfinite(budget)):
        raise inputs.InputError(f"--select-budget: expected seconds > 0, got {budget}")


def _on_shards(args) -> bool:
    """``recalibrate --data`` names Parquet shards (a folder or glob) or a Dask scheduler."""
    return (getattr(args, "dask_address", None) is not None
            or inputs.is_batch_input(args.data))


def validate_shard_recalibrate(args):
    """Shards (footers only), options, the scheduler's address; returns the shard set."""
    _check_flow_options(args)
    if args.decision_threshold is not None:
        raise inputs.InputError("--decision-threshold: not available on shards (the repair "
                                "in the threshold's space is fitted on one process's rows)")
    if args.dask_workers < 1:
        raise inputs.InputError(f"--dask-workers: expected a positive integer, got "
                                f"{args.dask_workers}")
    inputs.shard_options(args.calibrator, args.eval_sample)
    args.dask_address = inputs.dask_scheduler(args.dask_address)
    from flows.shards.plan import plan_shards

    try:
        plan = plan_shards(args.data, args.eval_data, args.input_kind, args.seed,
                           args.fraction)
    except (ValueError, TypeError, OSError) as exc:
        raise inputs.InputError(str(exc)) from exc
    inputs.check_shard_recalibration(plan, args.calibrator, args.eval_sample,
                                     _gate_options(args))
    inputs.champion_reads(args.tracking_uri, args.model_name, plan.data)
    return plan.data


def validate_recalibrate(args):
    """Files, arrays and options of a recalibration; returns the loaded ``--data``."""
    if hasattr(args, "eval_sample") and _on_shards(args):
        return validate_shard_recalibrate(args)
    inputs.data_file(args.data, "--data")
    inputs.data_file(args.eval_data, "--eval-data")
    _check_flow_options(args)
    dataset = inputs.load_data(args.data, args.input_kind)
    evaluation = (None if args.eval_data is None
                  else inputs.load_data(args.eval_data, dataset.input_kind))
    inputs.check_recalibration(dataset, evaluation, args.calibrator, args.fraction, args.seed,
                               _gate_options(args) if hasattr(args, "min_calibration") else None,
                               getattr(args, "decision_threshold", None))
    inputs.champion_reads(args.tracking_uri, args.model_name, dataset)
    return dataset


def validate_demo(args) -> None:
    if args.data is not None:
        validate_recalibrate(argparse.Namespace(**{**vars(args), "eval_data": None}))
    else:
        _check_flow_options(args)


def validate_monitor(args) -> None:
    from flows.store.registry import CHAMPION

    if not inputs.is_batch_input(args.data):
        inputs.data_file(args.data, "--data")
    # Either monitor scores @champion: without one, a second's answer, before the batch loads.
    inputs.registered_model(args.tracking_uri, args.model_name, CHAMPION)
    args.label_free = label_free_cli.is_label_free(args)
    if args.label_free:
        return label_free_cli.validate(args)
    if args.register_candidate:
        raise inputs.InputError(f"--register-candidate: {args.data} holds labels; a "
                                "prior-shift candidate is registered from a batch without "
                                "them (a labelled batch recalibrates through the gate)")
    inputs.data_file(args.data, "--data")
    _check_flow_options(args)
    inputs.non_negative(args.max_ece_increase, "--max-ece-increase")
    inputs.non_negative(args.max_nll_increase, "--max-nll-increase")
    batch = inputs.load_data(args.data, args.input_kind)
    inputs.champion_reads(args.tracking_uri, args.model_name, batch)
    inputs.check_recalibration(batch, None, args.calibrator, args.fraction, args.seed,
                               _gate_options(args))


def validate_schedule(args) -> None:
    args.cron = inputs.check_cron(args.cron, "--cron")
    args.monitor_cron = (inputs.monitor_cron_for(args.cron) if args.monitor_cron is None
                         else inputs.check_cron(args.monitor_cron, "--monitor-cron"))
    for path, option in ((args.data, "--data"), (args.eval_data, "--eval-data"),
                         (args.monitor_data, "--monitor-data")):
        inputs.data_file(path, option)
    dataset = validate_recalibrate(args)
    inputs.non_negative(args.max_ece_increase, "--max-ece-increase")
    inputs.non_negative(args.max_nll_increase, "--max-nll-increase")
    if args.monitor_data is not None:
        batch = inputs.load_data(args.monitor_data, dataset.input_kind)
        if batch.n_classes != dataset.n_classes:
            raise inputs.InputError(f"{batch.path}: has {batch.n_classes} classes but "
                                    f"{dataset.path} has {dataset.n_classes}")
    label_free_cli.validate_schedule(args)


def validate_predict(args) -> None:
    if _batch_predict_requested(args):
        from flows.files import expand_inputs

        try:
            expand_inputs(args.input)
        except ValueError as exc:
            raise inputs.InputError(f"{exc} (given as --input)") from exc
        inputs.new_folder(args.output, "--output")
    else:
        inputs.data_file(args.input, "--input")
        inputs.writable_output(args.output, "--output", args.input, overwrite=args.overwrite)
    inputs.model_reference(args.tracking_uri, args.model)
    if args.batch_size is not None and args.batch_size < 1:
        raise inputs.InputError(f"--batch-size: expected a positive integer, got "
                                f"{args.batch_size}")
    if not _batch_predict_requested(args):
        inputs.scoring_file(args.input, inputs.model_reads(args.tracking_uri, args.model),
                            "--input")


def validate_model_command(args) -> None:
    """A command on a registered model: it must be registered in an existing store (the
    operator commands check more: :func:`flows.cli.operator.validate`)."""
    inputs.registered_model(args.tracking_uri, args.model_name)


def validate_ui(args) -> None:
    inputs.listen_port(args.port)


# ---------------------------------------------------------------- commands
def _flow_options(args) -> dict:
    options = {"calibrator": args.calibrator, "fraction": args.fraction, "seed": args.seed,
               "model_name": args.model_name, "input_kind": args.input_kind,
               "dtype": args.dtype, "lock_timeout": args.lock_timeout,
               "store_timeout": args.store_timeout}
    if getattr(args, "select_budget", None) is not None:
        options["select_budget"] = args.select_budget
    return options


def _gate_options(args) -> dict:
    return {"min_calibration": args.min_calibration, "min_evaluation": args.min_evaluation,
            "max_class_share": args.max_class_share, "max_label_shift": args.max_label_shift,
            "min_class_rows": args.min_class_rows}


def cmd_recalibrate(args) -> int:
    from flows.recalibrate.flow import recalibrate

    shards = ({"dask_address": args.dask_address, "dask_workers": args.dask_workers,
               "eval_sample": args.eval_sample} if _on_shards(args) else {})
    result = recalibrate(data=str(args.data),
                         eval_data=None if args.eval_data is None else str(args.eval_data),
                         promote=not args.no_promote, tracking_uri=args.tracking_uri,
                         lock=args.lock, decision_threshold=args.decision_threshold,
                         **_flow_options(args), **_gate_options(args), **shards)
    _print_result(result, args.started, args.data)
    return 0


def cmd_demo(args) -> int:
    """Digits classifier (or ``--data``) -> full flow -> ``cord-ops-demo`` -> table."""
    from cord_ops import data
    from flows.recalibrate.flow import recalibrate

    if args.data is None:
        folder = Path.cwd() / tracking.STORE_DIR / "demo"
        folder.mkdir(parents=True, exist_ok=True)
        digits = data.digits_dataset(args.seed)
        path = data.save_npz(folder / f"digits_seed{args.seed}.npz", digits.scores,
                             digits.labels, digits.input_kind)
        print(f"demo data: held-out logits of a logistic regression on sklearn digits "
              f"({digits.n} x {digits.n_classes}) -> {path}")
    else:
        path = args.data
    result = recalibrate(data=str(path), promote=True, tracking_uri=args.tracking_uri,
                         lock=args.lock, **_flow_options(args))
    _print_result(result, args.started)
    return 0


def cmd_monitor(args) -> int:
    from flows.monitor.labelled import monitor

    if getattr(args, "label_free", False):
        return label_free_cli.run(args)
    result = monitor(data=str(args.data), model_name=args.model_name,
                     max_ece_increase=args.max_ece_increase,
                     max_nll_increase=args.max_nll_increase, input_kind=args.input_kind,
                     recalibrate_on_drift=not args.no_recalibrate, calibrator=args.calibrator,
                     fraction=args.fraction, seed=args.seed, dtype=args.dtype,
                     gate_options=_gate_options(args), tracking_uri=args.tracking_uri)
    if result is None:  # the champion went away between the check and the run
        return _error(f"model '{args.model_name}' has no @champion in {args.tracking_uri}")
    print(f"champion v{result.champion_version} on {args.data}:")
    for name in ("ece", "nll"):
        print(f"  {name}: {result.metrics[name]:.5f} (baseline {result.baseline[name]:.5f}, "
              f"drift {result.drift[name]:+.5f})")
    print("drift: " + ("; ".join(result.reasons) if result.reasons else "none"))
    for run_id, values in result.settled.items():
        print(f"labels met label-free run {run_id}: realised accuracy "
              f"{values['realised.accuracy']:.4f}, CBPE error {values['error.cbpe']:+.4f}")
        if values.get("verdict"):  # the prior-shift candidate's, as recorded on it
            print(f"  prior-shift candidate: {values['verdict']}")
    if result.recalibration is not None:
        _print_result(result.recalibration, args.started, args.data)
    return 0


def _stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt


def cmd_schedule(args) -> int:
    # SIGTERM before serving starts (while the managed server comes up) ends the command
    # like Ctrl-C; once serving, Prefect's runner takes SIGTERM over and shuts down.
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    from flows import schedule

    # Absolute paths: runs start later, from the runner's or the worker's directory.
    recal = {"data": str(args.data.resolve()),
             "eval_data": args.eval_data and str(args.eval_data.resolve()),
             "tracking_uri": args.tracking_uri, **_flow_options(args)}
    mon = {"data": str((args.monitor_data or args.data).resolve()), "model_name": args.model_name,
           "max_ece_increase": args.max_ece_increase, "max_nll_increase": args.max_nll_increase,
           "calibrator": args.calibrator, "fraction": args.fraction, "seed": args.seed,
           "dtype": args.dtype, "tracking_uri": args.tracking_uri,
           "skip_without_champion": True}
    label_free = label_free_cli.schedule_parameters(args)
    # Prefect's own cron parser has the last word, still before any server is involved.
    schedule.prefect_cron(args.cron)
    schedule.prefect_cron(args.monitor_cron)
    if label_free is not None:
        schedule.prefect_cron(args.label_free_cron)
    with flow_context(args, start_managed=True) as managed:
        print(f"recalibrate: cron {args.cron!r}; monitor: cron {args.monitor_cron!r}; "
              + (f"label-free monitor of new batches in {label_free['data']}: cron "
                 f"{args.label_free_cron!r}; " if label_free is not None else "")
              + f"tracking {args.tracking_uri}", flush=True)
        if args.work_pool:
            ids = schedule.deploy_to_work_pool(args.work_pool, args.cron, recal, mon,
                                               args.monitor_cron, label_free,
                                               args.label_free_cron)
            print(f"deployed to work pool '{args.work_pool}': {', '.join(ids)}")
            # The credential by reference: the line may end up in a terminal log or a ticket.
            api = (f"PREFECT_API_URL={managed.api_url} PREFECT_API_AUTH_STRING=\"$(cat "
                   f"{shlex.quote(str(credential.auth_file(managed.folder)))})\" "
                   if managed is not None else "")
            print(f"next: {api}prefect worker start --pool {args.work_pool}")
            if os.environ.get(PASSWORD_ENV):
                print(f"      with {USERNAME_ENV} and {PASSWORD_ENV} set in the worker's "
                      "environment (the deployments keep the tracking URI without them)")
        else:
            if managed is not None:
                print(f"serving until Ctrl-C or SIGTERM; the Prefect server keeps running "
                      f"after that: stop it with `{_server_hint(args)}`", flush=True)
            deployments = schedule.build_deployments(args.cron, recal, mon, args.monitor_cron,
                                                     label_free, args.label_free_cron)
            # One line per tick on this console, from the runs' processes (which read the
            # logging settings this names) and from this one; details stay in the runs' logs.
            os.environ["PREFECT_LOGGING_SETTINGS_PATH"] = str(tick_lines.write_config(
                server.state_folder(args.tracking_uri) / "schedule-logging.yml"))
            with tick_lines.console():
                schedule.serve_deployments(deployments)
            print("stopped serving")
    if managed is not None and args.work_pool:
        print(f"the Prefect server keeps running: stop it with `{_server_hint(args)}`")
    return 0


def cmd_server(args) -> int:
    folder = server.state_folder(args.tracking_uri)
    if args.action == "start":
        managed, started = server.start(folder)
        print(f"{'started' if started else 'already running:'} {managed.describe()}")
        runner = server.start_runner(folder)
        print(warm.status(folder) if runner is not None and warm.wait_ready(folder, runner)
              else f"warm runner did not start; see {warm.log_file(folder)} (commands start "
                   "in-process)")
        print(f"stop it with: {_server_hint(args)}")
        return 0
    if args.action == "stop":
        runner = warm.running(folder)  # server.stop stops it first
        pid = server.stop(folder)
        stopped = ([f"the Prefect server (pid {pid})"] if pid is not None else []) + (
            [f"the warm runner (pid {runner['pid']})"] if runner is not None else [])
        print(f"stopped {' and '.join(stopped)} of {folder}" if stopped
              else f"no managed Prefect server or warm runner running for {folder}")
        return 0
    managed = server.running(folder)
    if managed is None:
        print(f"not running (state folder {folder}); start it with: cord-ops server start")
        return NOT_RUNNING
    print(f"running: {managed.describe()}")
    print(warm.status(folder))
    return 0


def local_model_path(model: str, folder: Path, tracking_uri: str) -> Path:
    """``model`` as a local .onnx file: a path as given, or a registry URI downloaded from
    the store ``tracking_uri`` to ``folder``: a registered version (``models:/NAME@ALIAS``,
    ``models:/NAME/VERSION``) by :func:`flows.store.graphs.fetch_graph` (the graph only,
    checked by digest), any other (``runs:/...``, a logged model's id) as one .onnx file.
    """
    if ":/" not in model:
        return Path(model)
    if model.startswith("models:/") and ("/" in model[8:].strip("/") or "@" in model):
        # a registered version: its graph alone, checked against its run's digest
        from flows.store import graphs

        client = tracking.client(tracking_uri)
        name, version = graphs.version_of(client, model)
        return graphs.fetch_graph(client, tracking_uri, name, version, folder)
    local = tracking.download(tracking_uri, model, folder)
    found = [local] if local.is_file() else sorted(local.rglob("*.onnx"))
    if len(found) != 1:
        raise ValueError(f"{model}: expected one .onnx file in the model, found {len(found)}")
    return found[0]


def cmd_predict(args) -> int:
    import tempfile

    from cord_ops.data import clip_note
    from onnx_export.predict import predict_file

    if _batch_predict_requested(args):
        return cmd_predict_batch(args)
    with tempfile.TemporaryDirectory(prefix="cord-ops-model-") as folder:
        path = local_model_path(args.model, Path(folder), args.tracking_uri)
        summary = predict_file(path, args.input, args.output, batch_size=args.batch_size,
                               provider=args.provider, progress=True)
    print(f"wrote {summary['rows']} rows x {summary['n_classes']} classes to "
          f"{summary['output']} (providers: {', '.join(summary['providers'])})")
    if summary["sum_error"] > 0:
        print("input: " + clip_note(summary["input_width"], summary["sum_error"],
                                    summary["sum_error_row"]))
    return 0


def _batch_predict_requested(args) -> bool:
    """A folder or glob --input, or any Dask option, selects batch scoring on Dask."""
    return (inputs.is_batch_input(args.input) or args.dask_address is not None
            or args.dask_workers is not None)


def cmd_predict_batch(args) -> int:
    """``predict`` over many Parquet files on a Dask cluster (:mod:`flows.serve.batch`)."""
    import tempfile

    from flows.serve.batch import predict_batch

    with tempfile.TemporaryDirectory(prefix="cord-ops-model-") as folder:
        path = local_model_path(args.model, Path(folder), args.tracking_uri)
        result = predict_batch(path, args.input, args.output, dask_address=args.dask_address,
                               n_workers=args.dask_workers or 2, batch_size=args.batch_size)
    print(f"wrote {result.rows} rows from {result.files} files to {result.output} on "
          f"{len(result.workers)} Dask workers in {result.seconds:.1f} s "
          f"({result.rows / max(result.seconds, 1e-9):,.0f} rows/s)")
    return 0


def cmd_ui(args) -> int:
    """MLflow's UI with MLflow's basic authentication (:mod:`flows.platform.mlflow_ui`):
    its API writes the registry, so no other local account may use it."""
    from flows.platform import mlflow_ui

    uri = args.tracking_uri
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
               "--host", "127.0.0.1", "--port", str(args.port), "--app-name", "basic-auth"]
    if tracking.is_embedded(uri):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        command += ["--default-artifact-root", str(Path.cwd() / tracking.STORE_DIR)]
    folder = mlflow_ui.state_folder(uri)
    auth = mlflow_ui.prepare(folder)
    print(f"MLflow UI on http://127.0.0.1:{args.port} ({redact(uri)}); sign in as "
          f"{mlflow_ui.USER} with the password in {folder / mlflow_ui.PASSWORD_FILE}; "
          "Ctrl-C stops it", flush=True)
    # Become the server (no parent left behind), so a signal to this PID stops the UI.
    # Without the owner marker: the UI is this command, not something it leaves behind.
    os.execve(sys.executable, command, {**tracking.QUIET_ENVIRONMENT,
                                        **owner.detached_environment(os.environ), **auth})


def validate_serve(args) -> None:
    """Options, then the port (a taken one is a second's mistake, not one found after the
    model loaded), then the registered model."""
    from flows.serve.app import bind, check_options

    check_options(args.port, args.poll_interval, args.batch_window_ms / 1e3,
                  args.batch_max_rows, args.max_inflight, args.max_body_bytes,
                  args.max_rows)
    label_free_cli.check_monitor_window(args.monitor_window)
    if args.shadow_queue < 0:
        raise ValueError(f"--shadow-queue: expected an integer >= 0, got {args.shadow_queue}")
    if args.workers < 1:
        raise ValueError(f"--workers: expected a positive integer, got {args.workers}")
    if args.token_file:
        from flows.serve.access import read_token_file

        read_token_file(Path(args.token_file))
    try:
        bind(args.host, args.port).close()
    except OSError as exc:
        raise inputs.InputError(f"--port {args.port}: cannot listen on {args.host}:"
                                f"{args.port}: {exc.strerror or exc}") from exc
    validate_model_command(args)


def cmd_serve(args) -> int:
    from flows.serve.app import serve

    serve(args.tracking_uri, args.model_name, alias=args.alias, host=args.host,
          port=args.port, poll_interval=args.poll_interval,
          batch_window=args.batch_window_ms / 1e3, batch_max_rows=args.batch_max_rows,
          provider=args.provider, monitor_window=args.monitor_window,
          shadow_queue=args.shadow_queue, token_file=args.token_file,
          allowed_hosts=tuple(args.allowed_hosts), require_token=args.require_token,
          max_inflight=args.max_inflight, max_body_bytes=args.max_body_bytes,
          workers=args.workers, max_rows=args.max_rows)
    return 0


# ---------------------------------------------------------------- parser
#: What each command's parsed arguments carry (:func:`flows.cli.parser.build_parser`):
#: ``func`` runs it, ``validate`` checks its inputs before anything starts, ``prefect`` marks
#: a command that runs Prefect flows. reproduce, bench, status, promote, rollback and rollout
#: bring their own ``func``.
HANDLERS = {
    "recalibrate": {"func": cmd_recalibrate, "validate": validate_recalibrate, "prefect": True},
    "monitor": {"func": cmd_monitor, "validate": validate_monitor, "prefect": True},
    "schedule": {"func": cmd_schedule, "validate": validate_schedule},
    "predict": {"func": cmd_predict, "validate": validate_predict},
    "demo": {"func": cmd_demo, "validate": validate_demo, "prefect": True},
    "ui": {"func": cmd_ui, "validate": validate_ui},
    "server": {"func": cmd_server},
    "serve": {"func": cmd_serve, "validate": validate_serve},
    **{name: {"validate": operator_cli.validate} for name in ("status", "promote", "rollback")},
    "rollout": {"validate": rollout_cli.validate},
    **{name: {"prefect": True} for name in ("reproduce", "bench")},
}


def build_parser() -> argparse.ArgumentParser:
    """The ``cord-ops`` parser (:mod:`flows.cli.parser`) with :data:`HANDLERS` attached."""
    return cli_parser.build_parser(HANDLERS)


# ---------------------------------------------------------------- running a command
def _store_involved(exc: BaseException) -> bool:
    """Whether ``exc`` or an exception it was raised from comes from the tracking store."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc).__module__.split(".")[0] in STORE_PACKAGES:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def describe_error(exc: BaseException, tracking_uri: str) -> str:
    """One line for ``exc``: its own message for the errors cord-ops raises on purpose,
    the fault in words otherwise (:func:`flows.errors.in_words`: no class name, a file
    error names its file), the tracking URI added when the store is involved."""
    message = str(exc) if isinstance(exc, CordOpsError) else in_words(exc)
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    message = lines[0] if lines else type(exc).__name__
    if len(lines) > 1:
        message += " (...; --verbose shows all)"
    if _store_involved(exc) and tracking_uri not in message:
        message += f" [tracking URI {tracking_uri}]"
    return message


def private_umask() -> int:
    """Set this process's umask for everything the command and the processes it starts
    create (the store, the Prefect database, state files, logs, outputs): ``CORD_OPS_UMASK``
    (octal) when set, e.g. 0007 for a store a group shares; else the user's umask with
    every group and other permission removed, so files are 0600 and folders 0700 by
    default and never more open than the umask allows. Returns the umask set."""
    given = os.environ.get(UMASK_ENV, "").strip()
    if not given:
        current = os.umask(0o077)
        os.umask(current | 0o077)
        return current | 0o077
    try:
        value = int(given, 8)
    except ValueError:
        value = -1
    if not 0 <= value <= 0o777:
        raise inputs.InputError(f"{UMASK_ENV}={given!r}: expected an octal umask such as 0077 "
                                "(owner only, the default) or 0007 (owner and group)")
    os.umask(value)
    return value


def _without_credentials(args) -> str:
    """The command's tracking URI without its ``user:password@``, which goes to MLflow's
    environment variables for this process and those it starts (:mod:`flows.redact`);
    taken from ``MLFLOW_TRACKING_URI``, that variable, which flow-run processes inherit,
    is rewritten the same way."""
    uri = credentials_to_environment(args.tracking_uri)
    if args.tracking_uri_given is None and os.environ.get("MLFLOW_TRACKING_URI"):
        os.environ["MLFLOW_TRACKING_URI"] = uri
    return uri


def run(args: argparse.Namespace, forward: bool = False, watch: bool = False) -> int:
    """Validate, then run ``args.func``; every failure becomes the last line ``error: ...``.
    With ``forward``, a flow command whose inputs passed goes to the managed server's warm
    runner when one is ready for it (:mod:`flows.platform.warm`), else runs here. With ``watch``
    (this process is the command's), once the inputs passed a watchdog is started that
    kills what the command started when it ends (:func:`flows.store.owner.watch_command`)."""
    args.tracking_uri_given = args.tracking_uri
    args.tracking_uri = args.tracking_uri or tracking.tracking_uri()
    try:
        args.tracking_uri = _without_credentials(args)
        validate = getattr(args, "validate", None)
        if validate is not None:
            validate(args)
        if watch and args.command != "ui":  # the UI replaces this process: nothing to watch
            owner.watch_command(os.environ[owner.OWNER_ENV])
        if forward and args.command in warm.COMMANDS:
            code = warm.forward(server.state_folder(args.tracking_uri), args.argv,
                                time.perf_counter() - args.started)
            if code is not None:
                return code
        with contextlib.ExitStack() as stack:
            if getattr(args, "prefect", False):  # the command runs Prefect flows
                stack.enter_context(flow_context(args))
            return args.func(args) or 0
    except KeyboardInterrupt:
        return _error("interrupted")
    except Exception as exc:  # the CLI's contract: one line naming the cause, exit 1
        if args.verbose:
            traceback.print_exc()
        return _error(describe_error(exc, args.tracking_uri))
    finally:
        sys.stdout.flush()


def main(argv: list[str] | None = None, started: float | None = None,
         forward: bool = True, owns_process: bool | None = None) -> int:
    """Entry point of the ``cord-ops`` console script; returns the exit status. ``started``
    (a ``time.perf_counter`` value) and ``forward`` are the warm runner's: the command's
    start in the process that received it, and no forwarding from the runner itself.
    ``owns_process`` (default: when ``argv`` is None, i.e. the console script): this
    process exists for the command, so it marks what it starts and starts the watchdog
    that kills those processes when it ends (:func:`flows.store.owner.watch_command`),
    and sets the owner-only umask for all it creates (:func:`private_umask`)."""
    started = time.perf_counter() if started is None else started
    argv_given = argv
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.started, args.argv = started, argv
    # The process entry point, unlike the library, owns its process: switch MLflow and
    # Prefect telemetry off and bound MLflow's HTTP retries here (MLflow reads both only
    # from the environment), for this process and those it starts; a value the user set
    # wins.
    for key, value in {**tracking.QUIET_ENVIRONMENT, **tracking.http_environment(
            getattr(args, "store_timeout", tracking.DEFAULT_STORE_TIMEOUT))}.items():
        os.environ.setdefault(key, value)
    owns = argv_given is None if owns_process is None else owns_process
    if owns:
        try:
            private_umask()
        except inputs.InputError as exc:
            return _error(str(exc))
        owner.mark_command(keep=not forward)
    return run(args, forward=forward, watch=owns)


if __name__ == "__main__":
    sys.exit(main())
