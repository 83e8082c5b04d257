"""``cord-ops schedule``: cron deployments of the recalibration and monitoring flows (and the
label-free monitor of new batches), served from this process or registered with a work pool.

:func:`validate` checks the crons, files and options once into a :class:`Request`, which
builds each deployment's parameters; the data is re-read on every scheduled run, so none is
kept.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
from dataclasses import dataclass
from pathlib import Path

from flows import inputs
from flows.cli import label_free as label_free_cli
from flows.cli import recalibrate as recalibrate_cli
from flows.cli.context import Invocation, flow_context
from flows.cli.parser import DriftThresholds, FlowOptions, add_flow_options, add_thresholds
from flows.platform import credential, managed_server, tick_lines
from flows.redact import PASSWORD_ENV, USERNAME_ENV


@dataclass(frozen=True)
class Request:
    """The schedules, checked: the crons, the files as absolute paths (runs start later,
    from the runner's or the worker's directory), the options and, with
    ``--label-free-data``, the label-free monitor's."""

    invocation: Invocation
    cron: str
    monitor_cron: str
    data: Path
    eval_data: Path | None
    monitor_data: Path
    work_pool: str | None
    options: FlowOptions
    thresholds: DriftThresholds
    label_free: label_free_cli.Schedule | None

    def recalibrate_parameters(self) -> dict:
        return {"data": str(self.data),
                "eval_data": self.eval_data and str(self.eval_data),
                "tracking_uri": self.invocation.tracking_uri, **self.options.flow_kwargs()}

    def monitor_parameters(self) -> dict:
        options = self.options
        return {"data": str(self.monitor_data), "model_name": options.model_name,
                "max_ece_increase": self.thresholds.max_ece_increase,
                "max_nll_increase": self.thresholds.max_nll_increase,
                "calibrator": options.calibrator, "fraction": options.fraction,
                "seed": options.seed, "dtype": options.dtype,
                "tracking_uri": self.invocation.tracking_uri, "skip_without_champion": True}


def add_parser(sub) -> None:
    """``schedule``: cron deployments of recalibrate and monitor."""
    p = sub.add_parser(
        "schedule", help="serve cron deployments of recalibrate and monitor",
        description="Register cron deployments of the recalibration and monitoring flows and "
                    "serve them from this process. Without PREFECT_API_URL they run on the "
                    "local Prefect server cord-ops manages (started here if needed; see "
                    "`cord-ops server`), whose scheduler creates the runs.")
    p.add_argument("--cron", required=True, help='recalibration schedule, e.g. "0 3 * * *"')
    p.add_argument("--monitor-cron",
                   help=f"monitoring schedule (default: --cron {inputs.MONITOR_OFFSET_MINUTES} "
                        f"minutes later within the hour, else {inputs.MONITOR_OFFSET_SECONDS} s "
                        "later)")
    p.add_argument("--data", required=True, type=Path, help=".npz/.parquet re-read on every run")
    p.add_argument("--eval-data", type=Path, help="separate evaluation .npz")
    p.add_argument("--monitor-data", type=Path, help="labelled batch to monitor (default: --data)")
    p.add_argument("--work-pool", help="register with this work pool instead of serving here")
    label_free_cli.add_schedule_options(p)
    add_thresholds(p)
    add_flow_options(p)


def validate(args: argparse.Namespace, invocation: Invocation) -> Request:
    cron = inputs.check_cron(args.cron, "--cron")
    monitor_cron = (inputs.monitor_cron_for(cron) if args.monitor_cron is None
                    else inputs.check_cron(args.monitor_cron, "--monitor-cron"))
    for path, option in ((args.data, "--data"), (args.eval_data, "--eval-data"),
                         (args.monitor_data, "--monitor-data")):
        inputs.data_file(path, option)
    options = FlowOptions.read(args)
    dataset, _ = recalibrate_cli.load_and_check(invocation.tracking_uri, args.data,
                                                args.eval_data, options)
    thresholds = DriftThresholds.read(args)
    if args.monitor_data is not None:
        batch = inputs.load_data(args.monitor_data, dataset.input_kind)
        if batch.n_classes != dataset.n_classes:
            raise inputs.InputError(f"{batch.path}: has {batch.n_classes} classes but "
                                    f"{dataset.path} has {dataset.n_classes}")
    label_free = label_free_cli.schedule(args, monitor_cron, invocation.tracking_uri)
    return Request(invocation, cron, monitor_cron, args.data.resolve(),
                   args.eval_data and args.eval_data.resolve(),
                   (args.monitor_data or args.data).resolve(), args.work_pool, options,
                   thresholds, label_free)


def _stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt


def run(request: Request) -> int:
    # SIGTERM before serving starts (while the managed server comes up) ends the command
    # like Ctrl-C; once serving, Prefect's runner takes SIGTERM over and shuts down.
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    from flows import schedule

    recal, mon = request.recalibrate_parameters(), request.monitor_parameters()
    label_free = request.label_free and request.label_free.parameters()
    label_free_cron = request.label_free and request.label_free.cron
    cron, monitor_cron, pool = request.cron, request.monitor_cron, request.work_pool
    invocation = request.invocation
    # Prefect's own cron parser has the last word, still before any server is involved.
    schedule.prefect_cron(cron)
    schedule.prefect_cron(monitor_cron)
    if label_free is not None:
        schedule.prefect_cron(label_free_cron)
    with flow_context(invocation, request.options.store_timeout,
                      start_managed=True) as flows:
        managed = flows.managed
        print(f"recalibrate: cron {cron!r}; monitor: cron {monitor_cron!r}; "
              + (f"label-free monitor of new batches in {label_free['data']}: cron "
                 f"{label_free_cron!r}; " if label_free is not None else "")
              + f"tracking {invocation.tracking_uri}", flush=True)
        if pool:
            ids = schedule.deploy_to_work_pool(pool, cron, recal, mon, monitor_cron,
                                               label_free, label_free_cron)
            print(f"deployed to work pool '{pool}': {', '.join(ids)}")
            # The credential by reference: the line may end up in a terminal log or a ticket.
            api = (f"PREFECT_API_URL={managed.api_url} PREFECT_API_AUTH_STRING=\"$(cat "
                   f"{shlex.quote(str(credential.auth_file(managed.folder)))})\" "
                   if managed is not None else "")
            print(f"next: {api}prefect worker start --pool {pool}")
            if os.environ.get(PASSWORD_ENV):
                print(f"      with {USERNAME_ENV} and {PASSWORD_ENV} set in the worker's "
                      "environment (the deployments keep the tracking URI without them)")
        else:
            if managed is not None:
                print(f"serving until Ctrl-C or SIGTERM; the Prefect server keeps running "
                      f"after that: stop it with `{invocation.server_hint()}`", flush=True)
            deployments = schedule.build_deployments(cron, recal, mon, monitor_cron,
                                                     label_free, label_free_cron)
            # One line per tick on this console, from the runs' processes (which read the
            # logging settings this names) and from this one; details stay in the runs' logs.
            os.environ["PREFECT_LOGGING_SETTINGS_PATH"] = str(tick_lines.write_config(
                managed_server.state_folder(invocation.tracking_uri) / "schedule-logging.yml"))
            with tick_lines.console():
                schedule.serve_deployments(deployments)
            print("stopped serving")
    if managed is not None and pool:
        print(f"the Prefect server keeps running: stop it with `{invocation.server_hint()}`")
    return 0
