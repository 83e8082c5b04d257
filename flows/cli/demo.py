"""``cord-ops demo``: the no-argument demo: held-out logits of a digits classifier (or
``--data``) through the whole recalibration flow into ``cord-ops-demo``, then the table.

With ``--data``, :func:`validate` loads and checks the file once and :func:`run` hands the
dataset to the flow, as ``recalibrate`` does.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows import inputs
from flows.cli import recalibrate as recalibrate_cli
from flows.cli import summary
from flows.cli.context import Invocation, flow_context
from flows.cli.parser import FlowOptions, add_flow_options
from flows.store import tracking

DEMO_MODEL = "cord-ops-demo"


@dataclass(frozen=True)
class Request:
    """The demo, checked; ``dataset``: ``--data`` loaded (None: the digits are made when
    it runs)."""

    invocation: Invocation
    data: Path | None
    options: FlowOptions
    dataset: Any = None

    def flow_kwargs(self, data: Path, lock: str) -> dict:
        """The recalibration flow's keyword arguments on ``data``."""
        return {"data": str(data), "promote": True,
                "tracking_uri": self.invocation.tracking_uri, "lock": lock,
                **self.options.flow_kwargs()}


def add_parser(sub) -> None:
    """``demo``: the no-argument demo."""
    p = sub.add_parser("demo", help="no-argument demo: digits classifier -> full flow")
    p.add_argument("--data", type=Path, help="use this .npz instead of the digits classifier")
    add_flow_options(p, model_name=DEMO_MODEL)


def validate(args: argparse.Namespace, invocation: Invocation) -> Request:
    if args.data is None:
        return Request(invocation, None, FlowOptions.read(args))
    inputs.data_file(args.data, "--data")
    options = FlowOptions.read(args)
    dataset, _ = recalibrate_cli.load_and_check(invocation.tracking_uri, args.data, None,
                                                options)
    return Request(invocation, args.data, options, dataset)


def run(request: Request) -> int:
    """Digits classifier (or ``--data``) -> full flow -> ``cord-ops-demo`` -> table."""
    from flows.files import preloaded
    from flows.recalibrate.flow import recalibrate

    options = request.options
    with flow_context(request.invocation, options.store_timeout) as flows:
        if request.data is None:
            path, loaded = _digits(options.seed), []
        else:
            path, loaded = request.data, [(request.data, options.input_kind, request.dataset)]
        with preloaded(*loaded):
            result = recalibrate(**request.flow_kwargs(path, flows.lock))
        summary.print_result(result, request.invocation.started)
    return 0


def _digits(seed: int) -> Path:
    """The demo data: held-out logits of a logistic regression on sklearn's digits, saved
    under the working folder's store folder."""
    from cord_ops import data

    folder = Path.cwd() / tracking.STORE_DIR / "demo"
    folder.mkdir(parents=True, exist_ok=True)
    digits = data.digits_dataset(seed)
    path = data.save_npz(folder / f"digits_seed{seed}.npz", digits.scores, digits.labels,
                         digits.input_kind)
    print(f"demo data: held-out logits of a logistic regression on sklearn digits "
          f"({digits.n} x {digits.n_classes}) -> {path}")
    return path
