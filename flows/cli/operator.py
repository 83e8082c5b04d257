"""``cord-ops status | promote | rollback``: the operator's commands on a registered model
(logic in :mod:`flows.promotion.operations`). None of them imports Prefect; each talks to the
tracking store :func:`flows.store.tracking.tracking_uri` names."""

from __future__ import annotations

import argparse


def validate(args) -> None:
    """status / promote / rollback (and, through :func:`check_move`, rollout start): what
    the store's cheap reads can tell (:mod:`flows.store.reads`: read-only sqlite
    for an embedded store) is checked before MLflow, Prefect or onnx is imported, so a
    wrong version, the current champion or a version the guards of
    :mod:`flows.promotion.guards` refuse costs a second, not the stack's start-up."""
    from flows import inputs

    inputs.registered_model(args.tracking_uri, args.model_name)
    if args.command == "promote":
        if not args.reason.strip():
            raise inputs.InputError("--reason: say why this version should serve")
        state = model_state(args.tracking_uri, args.model_name)
        check_move(args.tracking_uri, args.model_name, state, str(args.version), args,
                   "promote")
    elif args.command == "rollback":
        _check_rollback(args, model_state(args.tracking_uri, args.model_name))


def model_state(uri: str, name: str) -> dict:
    """:func:`flows.store.reads.model_state` of a registered model, its read
    errors as one line."""
    import sqlite3

    from flows import inputs
    from flows.store import reads

    try:
        state = reads.model_state(uri, name)
    except sqlite3.DatabaseError as exc:
        raise inputs.InputError(f"{uri}: cannot read the MLflow store ({exc})") from exc
    if state is None:  # removed since registered_model looked
        raise inputs.InputError(f"model '{name}' is not registered in {uri}")
    return state


def check_move(uri: str, name: str, state: dict, version: str, args, verb: str) -> None:
    """A move of ``@champion`` to ``version`` (``verb``: promote, roll out), from the
    model's ``state``: the version exists, does not hold the alias already, and passes
    the guards with the overrides ``args`` gives."""
    from flows import inputs
    from flows.promotion import guards
    from flows.store.registry import CHAMPION

    held = state["versions"]
    if version not in held:
        raise inputs.InputError(f"--version {version}: model '{name}' has no version {version} "
                                f"in {uri} (versions: {', '.join(held) or 'none'})")
    if state["aliases"].get(CHAMPION) == version:
        raise inputs.InputError(f"v{version} already holds @{CHAMPION} of '{name}': nothing "
                                f"to {verb}")
    problem = guards.refusal(version, held[version], allow_harm=args.allow_harm,
                             allow_label_free=args.allow_label_free)
    if problem is not None:
        raise inputs.InputError(f"cannot {verb} v{version}: {problem}")


def _check_rollback(args, state: dict) -> None:
    from flows import inputs
    from flows.promotion import guards
    from flows.promotion.champion import HISTORY_TAG, parse_history, rollback_target
    from flows.store.registry import CHAMPION

    name = args.model_name
    target = rollback_target(parse_history(state["tags"].get(HISTORY_TAG)),
                             state["aliases"].get(CHAMPION), state["versions"].__contains__)
    if target is None:
        raise inputs.InputError(f"{name}: no earlier champion recorded to roll back to (use "
                                f"`cord-ops promote --model-name {name} --version N`)")
    problem = guards.refusal(target, state["versions"][target], allow_harm=args.allow_harm,
                             allow_label_free=args.allow_label_free)
    if problem is not None:
        raise inputs.InputError(f"cannot roll back to v{target}: {problem}")


def store_client(args):
    """(client, uri) of the store ``--tracking-uri`` or the environment names, checked
    (and created) first; every registry-side subcommand (here and :mod:`flows.cli.rollout`)
    opens its store with it."""
    from flows.store import tracking

    uri = tracking.store_uri(getattr(args, "tracking_uri", None))
    tracking.prepare_store(uri)
    return tracking.client(uri), uri


def cmd_status(args) -> int:
    import json
    import os
    import shutil
    import sys

    from flows.promotion import operations, rollout_record

    client, _ = store_client(args)
    record = rollout_record.read(client, args.model_name)
    report = operations.status(client, args.model_name, args.limit, record)
    if args.json:
        print(json.dumps(operations.status_json(report), indent=2))
        return 0
    # A terminal's width (or COLUMNS); output to a file or pipe keeps every word.
    width = (shutil.get_terminal_size().columns
             if sys.stdout.isatty() or "COLUMNS" in os.environ else None)
    print(operations.format_status(report, width, rollout_record.describe(record)))
    return 0


def _move_notes(move) -> None:
    """What a hand move relied on and what it should make the operator look at."""
    if move.nll is not None:
        # the figure the version's gate, run metrics and summary give for this split
        print(f"NLL:      {move.nll:.6g} on v{move.version}'s reference split (the served "
              "graph's outputs)")
    if move.overrides:
        print(f"override: {', '.join('--' + o for o in move.overrides)} (recorded in the "
              "champion history)")
    if move.warning:
        print(f"warning:  {move.warning}")


def cmd_promote(args) -> int:
    from flows.promotion import operations

    client, uri = store_client(args)
    move = operations.promote(client, uri, args.model_name, str(args.version), args.reason,
                                args.lock_timeout, allow_label_free=args.allow_label_free,
                                allow_harm=args.allow_harm)
    before = "none" if move.previous is None else f"v{move.previous}"
    print(f"{args.model_name}@champion: {before} -> v{args.version} ({args.reason}); "
          f"undo with `cord-ops rollback --model-name {args.model_name}`")
    _move_notes(move)
    return 0


def cmd_rollback(args) -> int:
    from flows.promotion import operations

    client, uri = store_client(args)
    move = operations.rollback(client, uri, args.model_name, args.reason, args.lock_timeout,
                                 allow_label_free=args.allow_label_free,
                                 allow_harm=args.allow_harm)
    why = f": {args.reason}" if args.reason else ""
    print(f"{args.model_name}@champion: v{move.previous} -> v{move.version} (rollback{why})")
    _move_notes(move)
    return 0


def add_cli(sub) -> None:
    """Add the operator subcommands to the ``cord-ops`` parser's subparsers."""
    p = sub.add_parser("status", help="champion, health and recent versions of a model")
    p.add_argument("--model-name", required=True, help="registered model name")
    p.add_argument("--limit", type=positive_int, default=10,
                   help="versions shown (default: 10)")
    p.add_argument("--json", action="store_true",
                   help="print the whole state as JSON (every word; the table's lines are "
                        "cut to the terminal's width)")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("promote", help="move @champion to a version, after the gate's checks")
    p.add_argument("--model-name", required=True, help="registered model name")
    p.add_argument("--version", required=True, type=positive_int, help="version to promote")
    p.add_argument("--reason", required=True, help="why (recorded as a version tag)")
    p.add_argument("--allow-label-free", action="store_true",
                   help="promote a label-free prior-shift candidate that no labels have "
                        "judged yet (refused without this)")
    add_allow_harm(p, "promote")
    add_lock_timeout(p)
    p.set_defaults(func=cmd_promote)

    p = sub.add_parser("rollback", help="return @champion to the previous champion")
    p.add_argument("--model-name", required=True, help="registered model name")
    p.add_argument("--reason", default=None,
                   help="why (recorded as a version tag and in the champion history)")
    p.add_argument("--allow-label-free", action="store_true",
                   help="roll back to a label-free prior-shift candidate that no labels "
                        "have judged yet (refused without this)")
    add_allow_harm(p, "roll back to")
    add_lock_timeout(p)
    p.set_defaults(func=cmd_rollback)


def add_allow_harm(parser, verb: str) -> None:
    """``--allow-harm``, the same override on every command that moves ``@champion``."""
    parser.add_argument("--allow-harm", action="store_true",
                        help=f"{verb} a version the gate found worse than the uncalibrated "
                             "model (refused without this; the champion history records "
                             "the override)")


def add_lock_timeout(parser) -> None:
    """``--lock-timeout``, the same option on every command that takes the registry lock."""
    parser.add_argument("--lock-timeout", type=float, default=None, metavar="SECONDS",
                        help="wait at most this long for a recalibration of the model to "
                             "leave the registry (default: the recalibration's)")


def positive_int(text: str) -> int:
    """argparse ``type`` for a version number or count (a 1-line error, not a traceback)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value
