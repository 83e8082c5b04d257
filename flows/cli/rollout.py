"""``cord-ops rollout start | status | abort``: an operator's commands for a staged rollout
(state and rules in :mod:`flows.promotion.rollout_record`; every ``cord-ops serve`` of the
model carries it out). None of them imports Prefect."""

from __future__ import annotations

import argparse

from flows.promotion.rollout_steps import (
    DEFAULT_CANARY,
    DEFAULT_MIN_REQUESTS,
    DEFAULT_MIN_SECONDS,
    MODES,
    Budget,
    Plan,
)


def _steps(text: str) -> tuple[float, ...]:
    """``10,25,50`` (percent) as shares."""
    try:
        values = tuple(float(part) / 100.0 for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected percentages like 10,25,50, got "
                                         f"{text!r}") from None
    return values


def cmd_rollout(args) -> int:
    from flows.cli.operator import store_client
    from flows.promotion import rollout_record

    if args.action == "start":
        plan = Plan.build(args.mode, args.steps, args.min_requests, args.min_seconds)
        budget = Budget(args.max_error_rate, args.max_p99_ratio, args.max_confidence_shift)
        client, uri = store_client(args)
        record = rollout_record.start(client, uri, args.model_name, str(args.version), plan,
                                      budget, args.reason, args.allow_harm, args.lock_timeout,
                                      allow_label_free=args.allow_label_free)
        print(rollout_record.format_record(record))
        if record.get("warning"):
            print(f"warning:  {record['warning']}; its promotion at the end will say so again")
        print(f"every `cord-ops serve --model-name {args.model_name}` follows it; watch with "
              f"`cord-ops rollout status --model-name {args.model_name}`, stop with "
              f"`cord-ops rollout abort --model-name {args.model_name}`")
        return 0
    client, uri = store_client(args)
    if args.action == "status":
        print(rollout_record.format_record(rollout_record.read(client, args.model_name)))
        return 0
    record = rollout_record.abort(client, uri, args.model_name, args.reason, args.lock_timeout)
    print(f"{args.model_name}: rollout {record['id']} of v{record['version']} aborted; "
          f"@champion stays v{record['champion']}")
    return 0


def check_start(args) -> None:
    """``rollout start``'s own options, before the store is read: the version and the
    reason are required, the plan and the budget must hold (a ValueError naming the
    option)."""
    missing = [flag for flag, value in (("--version", args.version),
                                        ("--reason", args.reason)) if value is None]
    if missing:
        raise ValueError(f"rollout start: {' and '.join(missing)} required")
    if not args.reason.strip():
        raise ValueError("--reason: say why this version should be rolled out")
    Plan.build(args.mode, args.steps, args.min_requests, args.min_seconds)
    Budget(args.max_error_rate, args.max_p99_ratio, args.max_confidence_shift).check()


def validate(args) -> None:
    """``rollout``: the model is registered; ``start``: its options
    (:func:`check_start`), then, from the store's cheap reads, a champion to roll out
    against and a version that may take its place (:func:`flows.cli.operator.check_move`),
    all before MLflow or onnx is imported."""
    from flows import inputs
    from flows.cli import operator
    from flows.promotion.rollout_steps import ROLLOUT_TAG, active_refusal, record_of
    from flows.store.registry import CHAMPION

    inputs.registered_model(args.tracking_uri, args.model_name)
    if args.action != "start":
        return
    try:
        check_start(args)
    except ValueError as exc:
        raise inputs.InputError(str(exc)) from None
    state = operator.model_state(args.tracking_uri, args.model_name)
    busy = active_refusal(args.model_name, record_of(state["tags"].get(ROLLOUT_TAG)))
    if busy is not None:
        raise inputs.InputError(busy)
    if CHAMPION not in state["aliases"]:
        raise inputs.InputError(
            f"{args.model_name} has no @{CHAMPION} to roll out against (use `cord-ops promote "
            f"--model-name {args.model_name} --version {args.version} --reason TEXT`)")
    operator.check_move(args.tracking_uri, args.model_name, state, str(args.version), args,
                        "roll out")


def add_cli(sub) -> None:
    """Add ``rollout`` to the ``cord-ops`` parser's subparsers."""
    from flows.cli.operator import add_lock_timeout, positive_int

    p = sub.add_parser(
        "rollout", help="stage a version beside @champion: shadow, canary steps, promotion",
        description="start: record a rollout of --version against @champion and set "
                    "@challenger; every `cord-ops serve` of the model then shadows and/or "
                    "canaries it, advancing a step after --min-requests compared requests "
                    "and --min-seconds within budget, promoting it after the last step and "
                    "rolling back on any breach. status: the rollout and its events. "
                    "abort: end it; @champion is not touched. See docs/rollout.md.")
    p.add_argument("action", choices=("start", "status", "abort"))
    p.add_argument("--model-name", required=True, help="registered model name")
    p.add_argument("--version", type=positive_int, help="start: the candidate version")
    p.add_argument("--mode", choices=MODES, default="shadow",
                   help="start: shadow (a shadow step, then the canary steps) or canary "
                        "(canary steps only) (default: shadow)")
    p.add_argument("--steps", type=_steps, default=DEFAULT_CANARY, metavar="PERCENTS",
                   help="start: canary steps in percent of requests (default: "
                        f"{','.join(f'{s * 100:g}' for s in DEFAULT_CANARY)})")
    p.add_argument("--min-requests", type=positive_int, default=DEFAULT_MIN_REQUESTS,
                   help="start: candidate requests compared with the champion before a step "
                        f"may advance (default: {DEFAULT_MIN_REQUESTS})")
    p.add_argument("--min-seconds", type=float, default=DEFAULT_MIN_SECONDS,
                   help=f"start: seconds at a step before it may advance (default: "
                        f"{DEFAULT_MIN_SECONDS:g})")
    defaults = Budget()
    p.add_argument("--max-error-rate", type=float, default=defaults.max_error_rate,
                   help="start: share of candidate requests that may fail (default: "
                        f"{defaults.max_error_rate:g})")
    p.add_argument("--max-p99-ratio", type=float, default=defaults.max_p99_ratio,
                   help="start: candidate p99 scoring time over the champion's (default: "
                        f"{defaults.max_p99_ratio:g})")
    p.add_argument("--max-confidence-shift", type=float,
                   default=defaults.max_confidence_shift,
                   help="start: largest |mean confidence change| on rows both scored "
                        f"(default: {defaults.max_confidence_shift:g})")
    p.add_argument("--reason", default=None,
                   help="start: why (required; recorded in the rollout and the champion "
                        "history); abort: why")
    p.add_argument("--allow-harm", action="store_true",
                   help="start: roll out a version the gate found worse than the "
                        "uncalibrated model (the operator's explicit override; its "
                        "promotion at the end applies it and the history records it)")
    p.add_argument("--allow-label-free", action="store_true",
                   help="start: roll out a label-free prior-shift candidate that no labels "
                        "have judged yet; its promotion at the end applies the same "
                        "override (refused without this)")
    add_lock_timeout(p)
    p.set_defaults(func=cmd_rollout)
