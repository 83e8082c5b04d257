"""``cord-ops monitor`` on batches without labels: its options, its checks (run before
anything is started or written) and its summary. A ``--data`` that is a folder, a glob or a
file without labels takes this path; a labelled file keeps the labelled monitor.

Exit status 0, or :data:`ALERT_STATUS` (3) when any batch is an alert (thresholds:
:mod:`flows.monitor.label_free.records`, docs/label-free.md), after every batch was logged.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from flows import inputs

if TYPE_CHECKING:  # records imports numpy; building the parser must not
    from flows.monitor.label_free import records

ALERT_STATUS = 3
#: flows.monitor.label_free.records's defaults, restated so building the parser imports no
#: numpy (a test keeps them equal).
DEFAULT_ALPHA = 0.01
DEFAULT_MAX_ACCURACY_DROP = 0.03
DEFAULT_MAX_PRIOR_SHIFT = 0.1
#: flows.serve.traffic.DEFAULT_WINDOW_ROWS and MIN_ROWS, restated for the parser.
DEFAULT_MONITOR_WINDOW = 10_000
MIN_MONITOR_WINDOW = 50


def thresholds(args: argparse.Namespace):
    """:func:`add_options`' thresholds, checked
    (:class:`flows.monitor.label_free.records.Thresholds`; a ValueError names the option)."""
    from flows.monitor.label_free import records

    return records.Thresholds(args.alpha, args.max_accuracy_drop, args.max_prior_shift).check()


@dataclass(frozen=True)
class Request:
    """``monitor`` without labels, checked: every batch of ``data`` read against what
    @champion reads; with ``labels``, the labels-only file for the one batch ``data``."""

    tracking_uri: str
    data: Path
    model_name: str
    thresholds: records.Thresholds
    emit_event: bool
    register_candidate: bool
    labels: str | None
    #: The batches as validation read them (path, how it was read, batch): the run's flow
    #: uses these instead of reading the files again.
    batches: tuple = ()


@dataclass(frozen=True)
class Schedule:
    """``schedule``'s label-free monitor, checked: ``data`` absolute (runs start later,
    from the runner's or the worker's directory) and its cron."""

    tracking_uri: str
    data: str
    cron: str
    model_name: str
    thresholds: records.Thresholds
    emit_event: bool
    register_candidate: bool

    def parameters(self) -> dict:
        """The label-free deployment's parameters."""
        return {"data": self.data, "model_name": self.model_name,
                "alpha": self.thresholds.alpha,
                "max_accuracy_drop": self.thresholds.max_accuracy_drop,
                "max_prior_shift": self.thresholds.max_prior_shift,
                "emit_events": self.emit_event, "tracking_uri": self.tracking_uri,
                "register_candidates": self.register_candidate}


def check_monitor_window(rows: int) -> None:
    if rows != 0 and rows < MIN_MONITOR_WINDOW:
        raise inputs.InputError(f"--monitor-window: expected 0 (off) or at least "
                                f"{MIN_MONITOR_WINDOW} rows, got {rows}")


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                        help="without labels: alert when a drift test's p-value is below this "
                             f"(default: {DEFAULT_ALPHA:g})")
    parser.add_argument("--max-accuracy-drop", type=float, default=DEFAULT_MAX_ACCURACY_DROP,
                        help="without labels: alert when the estimated accuracy is this far "
                             "below the reference split's "
                             f"(default: {DEFAULT_MAX_ACCURACY_DROP:g})")
    parser.add_argument("--max-prior-shift", type=float, default=DEFAULT_MAX_PRIOR_SHIFT,
                        help="without labels: alert when the EM class priors move this far "
                             "(total variation) from the reference split's "
                             f"(default: {DEFAULT_MAX_PRIOR_SHIFT:g})")
    parser.add_argument("--emit-event", action="store_true",
                        help="without labels: also emit a Prefect event "
                             "cord-ops.monitor.alert for every alert")
    parser.add_argument("--register-candidate", action="store_true",
                        help="without labels: register each batch's prior-shift candidate "
                             "(logged when the class priors moved) as a new label-free "
                             "version; @champion stays, promote refuses it until labels judge "
                             "it (docs/label-free.md)")


def add_schedule_options(parser: argparse.ArgumentParser) -> None:
    """``schedule``'s label-free monitor: a glob or folder of new batches, its cron and the
    thresholds (:func:`add_options`)."""
    parser.add_argument("--label-free-data",
                        help="also monitor, without labels, the batches of this glob or "
                             "folder that were not monitored yet (quote the glob)")
    parser.add_argument("--label-free-cron",
                        help="schedule of the label-free monitor (default: the monitoring "
                             "schedule)")
    add_options(parser)


def schedule(args: argparse.Namespace, monitor_cron: str,
             tracking_uri: str) -> Schedule | None:
    """``schedule``'s label-free options, or None without ``--label-free-data``: the glob
    may match nothing yet (batches arrive later), but it must be a glob or folder, and the
    thresholds and cron must hold (``monitor_cron``, checked: the default cron)."""
    if args.label_free_data is None:
        if args.label_free_cron is not None:
            raise inputs.InputError("--label-free-cron: needs --label-free-data")
        return None
    if not inputs.is_batch_input(args.label_free_data):
        raise inputs.InputError(f"--label-free-data {args.label_free_data}: expected a glob "
                                "pattern or a folder of new batches")
    try:
        checked = thresholds(args)
    except ValueError as exc:
        raise inputs.InputError(str(exc)) from exc
    cron = (monitor_cron if args.label_free_cron is None
            else inputs.check_cron(args.label_free_cron, "--label-free-cron"))
    text = str(args.label_free_data)
    data = text if Path(text).is_absolute() else str(Path.cwd() / text)
    return Schedule(tracking_uri, data, cron, args.model_name, checked, args.emit_event,
                    args.register_candidate)


def add_labels_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--labels",
                        help="a labels-only file (.npz arrays or Parquet columns 'labels' and "
                             "'row_id') for the batch --data, monitored earlier without "
                             "labels: log the realised metrics beside its estimates")


def is_label_free(data: Path, labels: str | None) -> bool:
    """Whether ``--data`` (with ``--labels``) asks for the label-free monitor."""
    if labels is not None:
        return True
    if inputs.is_batch_input(data):
        return True
    path = inputs.data_file(data, "--data")
    from flows.monitor.label_free import records

    try:
        return not records.has_labels(path)
    except ValueError as exc:
        raise inputs.InputError(f"{exc} (given as --data)") from exc


def validate(args: argparse.Namespace, tracking_uri: str) -> Request:
    """Thresholds, files, the champion and every batch against what it reads."""
    from flows.monitor.label_free import records
    from flows.store.registry import CHAMPION

    try:
        checked = thresholds(args)
        files = records.batch_files(args.data)
    except ValueError as exc:
        raise inputs.InputError(f"{exc}" if str(exc).startswith("--") else
                                f"{exc} (given as --data)") from exc
    inputs.registered_model(tracking_uri, args.model_name, CHAMPION)
    reads = inputs.model_reads(tracking_uri, f"models:/{args.model_name}@{CHAMPION}")
    if reads is None:
        raise inputs.InputError(f"'{args.model_name}'@champion in {tracking_uri}: its "
                                "classes and input kind are not recorded; label-free "
                                "monitoring needs a version registered by cord-ops")
    n_classes, input_kind, source = reads
    if args.input_kind not in ("auto", input_kind):
        raise inputs.InputError(f"--input-kind {args.input_kind}: {source} reads {input_kind}")
    request = Request(tracking_uri, args.data, args.model_name, checked, args.emit_event,
                      args.register_candidate, args.labels)
    if args.labels is not None:
        if args.register_candidate:
            raise inputs.InputError("--register-candidate: registers what a batch without "
                                    "labels estimates; with --labels there is nothing to "
                                    "register (the labels judge an earlier candidate)")
        _validate_labels(request, files, n_classes, input_kind, source)
        return request
    batches = []
    for path in files:
        try:
            batches.append((path, records.batch_kind(n_classes, input_kind),
                            records.read_batch(path, n_classes, input_kind)))
        except (ValueError, TypeError, OSError) as exc:
            raise inputs.InputError(f"{exc} (given as --data; {source} reads {n_classes} "
                                    f"classes of {input_kind})") from exc
    return replace(request, batches=tuple(batches))


def _validate_labels(request: Request, files, n_classes: int, input_kind: str,
                     source: str) -> None:
    from flows.monitor.label_free import labels

    if inputs.is_batch_input(request.data) or len(files) != 1:
        raise inputs.InputError(f"--labels: expected --data to name the one batch file the "
                                f"labels are for, got {request.data}")
    inputs.data_file(request.labels, "--labels")
    try:
        labels.check(request.tracking_uri, request.model_name, files[0], request.labels,
                                n_classes, input_kind)
    except (ValueError, TypeError, OSError) as exc:
        raise inputs.InputError(f"{exc} (given as --labels/--data; {source} reads "
                                f"{n_classes} classes of {input_kind})") from exc


def labels_summary(request: Request, settled: dict[str, dict[str, float]]) -> list[str]:
    lines = [f"labels of {request.data} from {request.labels}:"]
    for run_id, values in settled.items():
        lines.append(f"  met label-free run {run_id}: realised accuracy "
                     f"{values['realised.accuracy']:.4f}, ECE {values['realised.ece']:.4f}, "
                     f"CBPE error {values['error.cbpe']:+.4f}")
        if values.get("verdict"):  # the prior-shift candidate's, as recorded on it
            lines.append(f"    prior-shift candidate: {values['verdict']}")
    return lines


def summary(result) -> list[str]:
    lines = [f"champion v{result.champion_version} (reference split: {result.reference_rows} "
             f"rows, accuracy {result.reference_accuracy:.4f}), without labels:"]
    for r in result.reports:
        est = r.estimates
        lines.append(f"{r.path} ({r.n} rows, run {r.run_id}):")
        route = est.prior_method if est.prior_method != "cbpe" else (
            f"CBPE: label shift does not explain the batch, gap {est.label_shift_gap:.4f} > "
            f"{est.label_shift_tolerance:.4f}")
        lines.append(f"  estimated accuracy: CBPE {est.cbpe:.4f} (raw classifier "
                     f"{r.cbpe_raw:.4f}), ATC {est.atc:.4f}, DoC {est.doc:.4f}, "
                     f"prior-corrected {est.prior_corrected:.4f} ({route})")
        lines.append("  drift: " + ", ".join(f"{t.test} p={t.p_value:.3g} "
                                             f"(statistic {t.statistic:.4g})" for t in est.drift)
                     + f"; EM priors moved {est.prior_shift:.4f} (TV)")
        if r.candidate_version is not None:
            premise = ("; label shift does not explain this batch, so the reweighting's "
                       "premise fails" if est.prior_method == "cbpe" else "")
            lines.append(f"  prior-shift candidate: registered as v{r.candidate_version} "
                         f"(label-free; @champion unchanged{premise})")
        if r.realised is not None:
            lines.append(f"  labels: realised accuracy {r.realised['realised.accuracy']:.4f}, "
                         f"CBPE error {r.realised['error.cbpe']:+.4f}")
        lines.append("  alert: " + ("; ".join(r.reasons) if r.reasons else "none"))
    return lines


def run(request: Request) -> int:
    from flows.files import preloaded
    from flows.monitor.label_free.flow import monitor_label_free

    if request.labels is not None:
        from flows.monitor.label_free.labels import meet_labels_file

        settled = meet_labels_file(data=str(request.data), labels=str(request.labels),
                                   model_name=request.model_name,
                                   tracking_uri=request.tracking_uri)
        print("\n".join(labels_summary(request, settled)), flush=True)
        return 0

    limits = request.thresholds
    # the files validation expanded and read, so the flow neither lists nor reads them again
    with preloaded(*request.batches):
        result = monitor_label_free(data=[str(path) for path, _, _ in request.batches],
                                    model_name=request.model_name,
                                    alpha=limits.alpha,
                                    max_accuracy_drop=limits.max_accuracy_drop,
                                    max_prior_shift=limits.max_prior_shift,
                                    emit_events=request.emit_event,
                                    tracking_uri=request.tracking_uri,
                                    register_candidates=request.register_candidate)
    print("\n".join(summary(result)), flush=True)
    return ALERT_STATUS if result.alert else 0
