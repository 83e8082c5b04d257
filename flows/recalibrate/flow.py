"""The recalibration flow: calibrate a fixed classifier's outputs, repair them with CORD so no
top-1 decision changes, export one ONNX graph, track everything in MLflow, register the
model and let it take ``@champion`` only when it wins.

Reads top to bottom: load and validate -> skip when the data, calibrator and options are
those of the champion's run (:func:`skip_if_unchanged`) -> split -> fit calibrator -> fit
CORD -> evaluate uncal / base / cord on the evaluation split -> export ONNX -> verify ONNX
parity with onnxruntime on the evaluation split -> log to MLflow (with the evaluation split
pinned as the run's reference dataset input) -> register -> gate (rules in
:mod:`flows.promotion.rules`).

Splits too small to fit at all fail before any run exists; splits large enough to fit but
not to trust are registered and rejected by the gate with the reason. Warnings the
calibrator raises while fitting (non-convergence, capped iterations) are kept: run tag
``cord.fit.warnings`` and :attr:`RecalibrationResult.warnings`.

Failure contract: a bad data file or option, or a store that cannot be used, raises
before any MLflow run exists. After the run is created, any failing task marks it FAILED,
withdraws a version it registered (the alias goes back to where it was) and raises
:class:`RecalibrationError` naming the step; when the store itself is what failed, that
record goes to a local journal (:mod:`flows.store.journal`) that the next command replays.

Concurrency contract: fitting, evaluation and logging run in parallel with other
recalibrations; the registry section (clean-up -> register -> score the champion ->
decide -> move the alias -> finish) holds the model's registry lock (:mod:`flows.store.lock`)
and reads the champion only after acquiring it. Every run records its owner process
(:mod:`flows.store.owner`), so clean-up touches only what a dead process left.

Tasks that talk to the tracking store retry only a momentarily locked sqlite database
(:mod:`flows.store.retries`); with MLflow's bounded HTTP retries, a store that is down fails the
command within ``store_timeout`` seconds.

Where things live: the compute tasks in :mod:`flows.recalibrate.compute`, the tasks that
talk to the store in :mod:`flows.recalibrate.store_steps`, what a run records
(params, tags, digests) in :mod:`flows.recalibrate.artifacts`, and failure recording in
:mod:`flows.recalibrate.failure`.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from prefect import flow, get_run_logger

from cord_ops import metrics
from flows import inputs
from flows.platform import checkpoints, pinned, tick_lines
from flows.platform.task_presets import TaskRuns, task_runs
from flows.promotion import rules
from flows.promotion.champion import ChampionUnhealthyError
from flows.recalibrate.artifacts import run_params
from flows.recalibrate.compute import (
    check_no_harm,
    check_options,
    check_shard_options,
    evaluate_reports,
    evaluate_shards,
    export_model,
    fit_calibrator,
    fit_calibrator_on_shards,
    fit_cord,
    fit_cord_on_shards,
    load_dataset,
    load_shards,
    plan_shard_inputs,
    served_report,
    split_dataset,
    verify_parity,
)
from flows.recalibrate.failure import Failure, RecalibrationError, uri_if_store
from flows.recalibrate.selection import DEFAULT_BUDGET as DEFAULT_SELECT_BUDGET
from flows.recalibrate.selection import choose_family, harm_reason
from flows.recalibrate.store_steps import (
    champion_threshold,
    ensure_model,
    finish_run,
    gate,
    log_onnx_model,
    log_params_and_metrics,
    log_reference,
    log_report_artifacts,
    prepare_store,
    register,
    skip_if_unchanged,
    start_run,
    verify_artifacts,
)
from flows.store import lock as registry_lock
from flows.store import owner, tracking

#: RecalibrationError is raised by the flow and defined with the failure handling.
__all__ = ["RecalibrationError", "RecalibrationResult", "is_shard_input", "recalibrate"]

DEFAULT_EVAL_SAMPLE = inputs.DEFAULT_EVAL_SAMPLE


@dataclass
class RecalibrationResult:
    """What one recalibration produced and where to find it.

    ``timings``: seconds each task spent running, from Prefect's task-run records
    (``total_run_time``), summed over repeated calls. ``warnings``: the fit's warnings, and the
    do-no-harm warning when the calibrator lost to the identity map on its own
    calibration split (:func:`flows.recalibrate.compute.no_harm_warning`).
    """

    run_id: str
    experiment_id: str
    tracking_uri: str
    model_name: str
    version: str | None
    decision: rules.GateDecision | None
    eta_star: float
    reports: dict[str, dict[str, float]]
    changes: dict[str, int]
    onnx_max_abs_diff: float
    timings: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: what the repair did on the evaluation split (``cord_ops.metrics.repair_effect``)
    repair: dict[str, float] = field(default_factory=dict)
    #: the binary decision threshold kept (None: the argmax)
    decision_threshold: float | None = None
    #: what loading changed in the input files (``data.Dataset.load_note``)
    input_notes: list[str] = field(default_factory=list)
    #: Why nothing was fitted or registered (:func:`skip_if_unchanged`); then ``version``
    #: and ``decision`` are None and the reports empty.
    skipped: str | None = None
    #: The family fitted and how it was chosen
    #: (:class:`flows.recalibrate.selection.Choice`; None on shards).
    choice: object | None = None


# ---------------------------------------------------------------- the flow
@flow(name="recalibrate", persist_result=False)
def recalibrate(data: str | Path, eval_data: str | Path | None = None, calibrator: str = "auto",
                fraction: float = 0.5, seed: int = 0, model_name: str = "cord-ops",
                input_kind: str = "auto", dtype: str = "float32", promote: bool = True,
                lock_timeout: float = registry_lock.DEFAULT_TIMEOUT,
                store_timeout: float = tracking.DEFAULT_STORE_TIMEOUT,
                lock: str = "auto", min_calibration: int | None = None,
                min_evaluation: int | None = None, max_class_share: float | None = None,
                max_label_shift: float | None = None, min_class_rows: int | None = None,
                decision_threshold: float | None = None,
                tracking_uri: str | None = None, dask_address: str | None = None,
                dask_workers: int = 2,
                eval_sample: int = DEFAULT_EVAL_SAMPLE,
                select_budget: float | None = DEFAULT_SELECT_BUDGET) -> RecalibrationResult:
    """Recalibrate the classifier outputs in ``data`` (.npz or Parquet) and register the
    result.

    ``eval_data`` given: calibrate on all of ``data`` and evaluate on ``eval_data``; otherwise split
    ``data`` with ``fraction`` for calibration (seeded). ``dtype`` is the ONNX graph's
    float type. With ``promote=False`` the gate is evaluated and recorded but the alias
    never moves. ``lock_timeout``: seconds to wait for the model's registry lock;
    ``store_timeout``: seconds a store that is down may take to fail the flow; ``lock``:
    the registry lock's kind (``auto``: :func:`flows.store.lock.choose`). Raises
    :class:`RecalibrationError` naming the failed step. ``min_calibration``,
    ``min_evaluation``, ``max_class_share``, ``max_label_shift`` and ``min_class_rows``
    override the gate's defaults for K (:class:`flows.promotion.rules.Policy`). When the
    champion could not be scored, the candidate is registered as rejected, the run
    finished, and then :class:`flows.promotion.champion.ChampionUnhealthyError` is raised.
    ``tracking_uri``: the MLflow store (default: MLFLOW_TRACKING_URI, else
    ``./mlruns/mlflow.db``).

    ``data`` a folder or glob of Parquet shards, or ``dask_address`` given: the fits and
    metrics run on Dask (the scheduler at ``dask_address``, else a local cluster of
    ``dask_workers`` processes) over a seeded per-row split inside each shard, with
    ``eval_sample`` evaluation rows gathered for parity, the reference split and the gate
    (docs/scale.md).

    ``calibrator="auto"``: the family is chosen by cross-validation on the calibration
    split, identity included (:mod:`flows.recalibrate.selection`; no family is started
    after ``select_budget`` seconds); when the chosen family does harm on the evaluation
    split, identity is fitted instead before anything is registered. A forced family is
    cross-validated against identity, and a loss is a warning. Shards refuse ``auto``.

    ``decision_threshold`` (binary models): CORD keeps the decision ``p1 > t`` instead of
    the argmax (``cord_ops.threshold``), the graph's label is that decision, and the
    gate's TPCR and the parity's agreement are measured on it; not on shards. Without
    one, a binary model keeps its champion's (version tag ``cord.decision_threshold``), so
    a scheduled or drift-started recalibration never moves its decisions back to the
    argmax; a candidate deciding otherwise than the champion is rejected by the gate.

    A run of a deployment whose parameters are not the deployment's is refused first
    (:func:`flows.platform.pinned.check`).
    """
    pinned.check()
    uri = tracking.store_uri(tracking_uri)
    folder = tracking.local_store_folder(uri)
    if lock == "auto":
        lock = registry_lock.choose(folder, _prefect_api_url())
    gate_options = {"min_calibration": min_calibration, "min_evaluation": min_evaluation,
                    "max_class_share": max_class_share, "max_label_shift": max_label_shift,
                    "min_class_rows": min_class_rows}
    options = {"calibrator": calibrator, "seed": str(seed), "fraction": repr(fraction),
               "dtype": dtype, "promote": str(promote)}
    with task_runs() as runs:
        bracket = _Bracket(uri, runs)
        with bracket.before_run():
            if is_shard_input(data, dask_address):
                if decision_threshold is not None:
                    raise ValueError("decision_threshold: not available on shards")
                plan = plan_shard_inputs(str(data), _text(eval_data), input_kind, seed, fraction)
                policy = check_shard_options(calibrator, dtype, eval_sample, plan, gate_options)
                shards = bracket.session = load_shards(plan, dask_address, dask_workers)
                dataset, eval_dataset = shards.plan.data, shards.plan.evaluation
                options.update(dask=dask_address or f"local:{dask_workers}",
                               eval_sample=str(eval_sample))
            else:
                dataset = load_dataset(str(data), input_kind)
                eval_dataset = (load_dataset(str(eval_data), dataset.input_kind)
                                if eval_data is not None else None)
                policy = check_options(calibrator, dtype, seed, fraction, dataset, eval_dataset,
                                       gate_options, decision_threshold)
            prepare_store(uri, store_timeout)
            if decision_threshold is None and bracket.session is None and dataset.n_classes == 2:
                decision_threshold = champion_threshold(uri, model_name)
            if decision_threshold is not None:
                options["decision_threshold"] = repr(float(decision_threshold))
            run_id, experiment = start_run(uri, model_name, dataset, eval_dataset, options)
        checkpoints.checkpoint("start_run")
        with bracket.after_run(Failure(uri, folder, run_id, model_name)) as failure, \
                _heartbeat(uri, folder, run_id):
            if (skipped := skip_if_unchanged(uri, run_id, model_name)) is not None:
                return bracket.skipped(skipped, run_id, experiment, model_name)
            fit = (_fit(dataset, eval_dataset, calibrator, seed, fraction, select_budget,
                        decision_threshold, policy) if bracket.session is None
                   else _fit_on_shards(bracket.session, calibrator, eval_sample))
            model = export_model(fit.calibrator, fit.repair, dataset.n_classes,
                                 dataset.input_kind, dtype)
            parity = verify_parity(model, fit.evaluation, fit.report, dtype, fit.calibrator,
                                   fit.repair)
            # One NLL per fact: the served graph's (on shards the cord row covers every
            # evaluation row, the graph ran on the sample: docs/promotion.md)
            report = fit.report if fit.on_shards else served_report(fit.report, parity)
            log_params_and_metrics(uri, run_id, fit.params(calibrator, dataset, eval_dataset, seed),
                                   report, fit.repair, parity, fit.warnings, policy, fit.choice)
            checkpoints.checkpoint("log_params")
            digests = log_report_artifacts(uri, run_id, report, fit.calibrator, fit.repair,
                                           fit.choice)
            digests.update(log_reference(uri, run_id, fit.evaluation))
            checkpoints.checkpoint("log_artifacts")
            model_info = log_onnx_model(uri, run_id, experiment, model, fit.evaluation, dtype)
            checkpoints.checkpoint("log_model")
            verify_artifacts(uri, run_id, model_info, model, digests)
            ensure_model(uri, model_name)
            with bracket.registry_section(failure, lock, model_name, lock_timeout, folder):
                checkpoints.checkpoint("lock_acquired")
                failure.version, failure.previous = register(
                    uri, run_id, experiment, model_name, model_info, parity, dataset, fit.repair,
                    fit.calibrator.name, fit.choice)
                checkpoints.checkpoint("registered")
                decision = gate(uri, model_name, failure.version, failure.previous, fit.counts,
                                fit.evaluation, report, parity, model, dtype, policy, promote)
                finish_run(uri, run_id, model_name, failure.version)
    if decision.champion_problem is not None:
        # Finished and recorded; the registry is stuck until an operator acts, so say so.
        raise ChampionUnhealthyError(model_name, decision.champion_version,
                                     decision.champion_problem, candidate=failure.version)
    tick_lines.log_result(f"recalibrate: v{failure.version} {decision.label}: "
                          f"{decision.reason}"[:1000])
    return fit.result(run_id, experiment, uri, model_name, decision, failure.version, parity,
                      report, runs, [dataset, eval_dataset])


# ---------------------------------------------------------------- the flow's brackets
class _Bracket:
    """What a failure of the flow must undo and how it is reported: the step named is the
    task Prefect ran last (:class:`flows.platform.task_presets.TaskRuns`), the Dask
    session is closed, and once the run exists its :class:`Failure` is recorded."""

    def __init__(self, uri: str, runs: TaskRuns):
        self.uri, self.runs = uri, runs
        self.session = None

    def _error(self, exc: Exception, journal: str | None = None) -> RecalibrationError:
        step = self.runs.current
        return RecalibrationError(step, exc, uri_if_store(step, self.uri), journal)

    def _close(self) -> None:
        if self.session is not None:
            self.session.close()

    @contextmanager
    def before_run(self):
        """Loading, checking and starting the run: nothing to undo but the session."""
        try:
            yield
        except Exception as exc:
            self._close()
            raise self._error(exc) from exc

    @contextmanager
    def after_run(self, failure: Failure):
        """The run exists: any failure (Ctrl-C too) marks it and withdraws its version;
        yields ``failure``, which holds the version once registered."""
        try:
            yield failure
        except BaseException as exc:
            self._close()
            failure.record(exc)
            if isinstance(exc, Exception):
                raise self._error(exc, failure.journal) from exc
            raise

    @contextmanager
    def registry_section(self, failure: Failure, lock: str, model_name: str,
                         lock_timeout: float, folder: Path | None):
        """One run of this model at a time, across processes: holds the model's registry
        lock; a failure inside is recorded (the version withdrawn) before it is released."""
        self.runs.mark("registry_lock")
        holder = {"run_id": failure.run_id, **owner.Owner.current().record()}
        with registry_lock.registry_lock(lock, model_name, lock_timeout, get_run_logger(),
                                         holder, client=tracking.client(self.uri),
                                         store_folder=folder):
            try:
                yield
            except BaseException as exc:
                failure.record(exc)  # withdraw while still holding the lock
                raise

    def skipped(self, why: str, run_id: str, experiment: str,
                model_name: str) -> RecalibrationResult:
        self._close()
        tick_lines.log_result(f"recalibrate: skipped: {why}")
        return RecalibrationResult(
            run_id=run_id, experiment_id=experiment, tracking_uri=self.uri,
            model_name=model_name, version=None, decision=None, eta_star=float("nan"),
            reports={}, changes={}, onnx_max_abs_diff=float("nan"),
            timings=self.runs.seconds(), skipped=why)


def _heartbeat(uri: str, folder: Path | None, run_id: str):
    """Owners on this host are judged by pid; only a store other hosts reach needs beats."""
    return owner.Heartbeat(tracking.client(uri), run_id) if folder is None else nullcontext()


# ---------------------------------------------------------------- the fits
@dataclass
class _Fit:
    """The fitted calibrator and CORD, their warnings, and what they were evaluated on."""

    calibrator: object
    repair: object
    warnings: list[str]
    report: object
    evaluation: object
    counts: tuple
    choice: object | None  # None on shards, which refuse ``auto``

    @property
    def on_shards(self) -> bool:
        return self.choice is None

    def params(self, calibrator: str, dataset, eval_dataset, seed: int) -> dict[str, str]:
        params = run_params(calibrator, dataset, sum(self.counts[0]), sum(self.counts[1]),
                            seed, self.repair)
        if self.on_shards:
            params.update(n_evaluation_sample=str(self.evaluation.n),
                          n_shards=str(len(dataset.files) + (
                              0 if eval_dataset is None else len(eval_dataset.files))))
        return params

    def result(self, run_id, experiment, uri, model_name, decision, version, parity, report,
               runs: TaskRuns, sources) -> RecalibrationResult:
        flat = metrics.flat_warning(report.effect, report.threshold)
        return RecalibrationResult(
            run_id=run_id, experiment_id=experiment, tracking_uri=uri, model_name=model_name,
            version=version, decision=decision, eta_star=self.repair.eta_,
            reports=report.reports, changes=report.changes,
            onnx_max_abs_diff=parity.max_abs_diff, timings=runs.seconds(),
            warnings=self.warnings + [w for w in [flat] if w], repair=report.effect,
            decision_threshold=self.repair.decision_threshold, choice=self.choice,
            input_notes=[note for source in sources
                         if (note := getattr(source, "load_note", lambda: None)()) is not None])


def _fit(dataset, eval_dataset, calibrator: str, seed: int, fraction: float,
         select_budget: float | None, decision_threshold: float | None, policy) -> _Fit:
    """Split, choose the family, fit it and CORD, evaluate. When ``auto``'s choice does
    harm on the evaluation split, identity is fitted instead: a first version must not be
    left without a champion because no calibrator helped, so the classifier's own
    probabilities are served."""
    calibration, evaluation = split_dataset(dataset, eval_dataset, seed, fraction)
    choice = choose_family(calibration, calibrator, seed, select_budget)
    fitted, calibrator_warnings = fit_calibrator(calibration, choice.family)
    repair, cord_warnings = fit_cord(calibration, fitted, decision_threshold)
    cord_warnings = cord_warnings + check_no_harm(calibration, fitted, repair)
    report = evaluate_reports(evaluation, fitted, repair)
    harm = harm_reason(report, policy) if calibrator == "auto" else None
    if harm is not None and choice.family != "identity":
        choice.fall_back(harm)
        get_run_logger().warning("select: %s", choice.how)
        fitted, calibrator_warnings = fit_calibrator(calibration, choice.family)
        repair, cord_warnings = fit_cord(calibration, fitted, decision_threshold)
        report = evaluate_reports(evaluation, fitted, repair)
    counts = (rules.label_counts(calibration.labels, dataset.n_classes),
              rules.label_counts(evaluation.labels, dataset.n_classes))
    return _Fit(fitted, repair, choice.warnings + calibrator_warnings + cord_warnings, report,
                evaluation, counts, choice)


def _fit_on_shards(session, calibrator: str, eval_sample: int) -> _Fit:
    """The same on Dask, over the shards; no family choice (shards refuse ``auto``)."""
    with session:  # the cluster is released once the metrics are reduced
        fitted, calibrator_warnings = fit_calibrator_on_shards(session, calibrator)
        (repair, fitted), cord_warnings = fit_cord_on_shards(session, fitted)
        report, evaluation, counts = evaluate_shards(session, fitted, repair, eval_sample)
    return _Fit(fitted, repair, calibrator_warnings + cord_warnings, report, evaluation, counts,
                None)


# ---------------------------------------------------------------- helpers
def is_shard_input(data, dask_address: str | None = None) -> bool:
    """Whether ``data`` is read as Parquet shards on Dask: a folder or glob, or any data
    when a scheduler is named."""
    return dask_address is not None or inputs.is_batch_input(data)


def _text(path) -> str | None:
    return None if path is None else str(path)


def _prefect_api_url() -> str | None:
    """A Prefect server other processes share, if one is configured."""
    from flows.platform.temporary_server import configured_api_url

    return configured_api_url()
