"""``cord-ops serve``: HTTP scoring of a registered model's alias that follows the alias
(:mod:`flows.serve.app`); the port, options and model are checked before anything loads."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from flows import inputs
from flows.cli import label_free as label_free_cli
from flows.cli.context import Invocation


@dataclass(frozen=True)
class Request:
    """The server's options, checked; :meth:`serve_kwargs` names them as
    :func:`flows.serve.app.serve` does."""

    invocation: Invocation
    model_name: str
    alias: str
    host: str
    port: int
    poll_interval: float
    batch_window: float
    batch_max_rows: int
    provider: str
    monitor_window: int
    shadow_queue: int
    token_file: str | None
    allowed_hosts: tuple[str, ...]
    require_token: bool
    max_inflight: int
    max_body_bytes: int
    workers: int
    max_rows: int

    def serve_kwargs(self) -> dict:
        return {"alias": self.alias, "host": self.host, "port": self.port,
                "poll_interval": self.poll_interval, "batch_window": self.batch_window,
                "batch_max_rows": self.batch_max_rows, "provider": self.provider,
                "monitor_window": self.monitor_window, "shadow_queue": self.shadow_queue,
                "token_file": self.token_file, "allowed_hosts": self.allowed_hosts,
                "require_token": self.require_token, "max_inflight": self.max_inflight,
                "max_body_bytes": self.max_body_bytes, "workers": self.workers,
                "max_rows": self.max_rows}


def add_parser(sub) -> None:
    """``serve``: HTTP scoring that follows an alias."""
    p = sub.add_parser("serve", help="HTTP scoring of NAME@ALIAS that follows the alias")
    p.add_argument("--model-name", required=True, help="registered model name")
    p.add_argument("--alias", default="champion", help="alias to follow (default: champion)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=5005, help="port (default: 5005)")
    p.add_argument("--poll-interval", type=float, default=10.0,
                   help="seconds between alias polls (default: 10)")
    p.add_argument("--batch-window-ms", type=float, default=2.0,
                   help="longest wait for concurrent requests to batch (default: 2)")
    p.add_argument("--batch-max-rows", type=int, default=4096,
                   help="most rows per onnxruntime run (default: 4096)")
    p.add_argument("--provider", default="auto", choices=("auto", "cpu", "cuda"),
                   help="onnxruntime execution provider (default: cuda when available)")
    p.add_argument("--monitor-window", type=int, default=label_free_cli.DEFAULT_MONITOR_WINDOW,
                   metavar="ROWS",
                   help="answered rows kept for label-free monitoring (/monitor, gauges in "
                        "/metrics; 0: off; default: %(default)s)")
    p.add_argument("--shadow-queue", type=int, default=1024,
                   help="request copies waiting for the other version during a rollout; "
                        "more are dropped and counted (0: do not follow rollouts; "
                        "default: 1024)")
    p.add_argument("--token-file", metavar="PATH",
                   help="file (mode 600) holding the token POST /monitor/flush needs (default: "
                        "CORD_OPS_SERVE_TOKEN, else a new one written to the store's state "
                        "folder as serve-PORT.token)")
    p.add_argument("--require-token", action="store_true",
                   help="/invocations needs the token too (default: scoring is open)")
    p.add_argument("--max-inflight", type=int, default=128,
                   help="scoring requests admitted at once; more are refused at once with "
                        "503 and Retry-After (default: 128)")
    p.add_argument("--max-body-bytes", type=int, default=64 * 2**20,
                   help="largest request body; bigger: 413 before it is read whole "
                        "(default: 64 MiB)")
    p.add_argument("--max-rows", type=int, default=65536,
                   help="most rows in one request; more: 413 before any row is converted "
                        "(default: 65536)")
    p.add_argument("--workers", type=int, default=1,
                   help="worker processes on the one port, each following the alias "
                        "(default: 1)")
    p.add_argument("--allowed-hosts", nargs="+", default=[], metavar="HOST",
                   help="Host header names answered besides localhost, 127.0.0.1, ::1 and "
                        "the bound address (*: any)")


def validate(args: argparse.Namespace, invocation: Invocation) -> Request:
    """Options, then the port (a taken one is a second's mistake, not one found after the
    model loaded), then the registered model (in an existing store)."""
    from flows.serve.app import bind, check_options

    batch_window = args.batch_window_ms / 1e3
    check_options(args.port, args.poll_interval, batch_window, args.batch_max_rows,
                  args.max_inflight, args.max_body_bytes, args.max_rows)
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
    inputs.registered_model(invocation.tracking_uri, args.model_name)
    return Request(invocation, args.model_name, args.alias, args.host, args.port,
                   args.poll_interval, batch_window, args.batch_max_rows, args.provider,
                   args.monitor_window, args.shadow_queue, args.token_file,
                   tuple(args.allowed_hosts), args.require_token, args.max_inflight,
                   args.max_body_bytes, args.workers, args.max_rows)


def run(request: Request) -> int:
    from flows.serve.app import serve

    serve(request.invocation.tracking_uri, request.model_name, **request.serve_kwargs())
    return 0
