"""``cord-ops status | promote | rollback``: the operator's commands on a registered model
(logic in :mod:`flows.promotion.operations`). None of them imports Prefect; each talks to the
tracking store :func:`flows.registry.tracking.tracking_uri` names."""

from __future__ import annotations

import argparse


def store_client(args):
    """(client, uri) of the store ``--tracking-uri`` or the environment names, checked
    (and created) first; every registry-side subcommand (here and :mod:`flows.cli.rollout`)
    opens its store with it."""
    from flows.registry import tracking

    uri = tracking.store_uri(getattr(args, "tracking_uri", None))
    tracking.prepare_store(uri)
    return tracking.client(uri), uri


def cmd_status(args) -> int:
    from flows.promotion import operations as champion_ops
    from flows.promotion import rollout

    client, _ = store_client(args)
    lines = champion_ops.format_status(champion_ops.status(client, args.model_name,
                                                           args.limit)).splitlines()
    # After champion, health and history: a rollout in progress is part of that state.
    lines.insert(4, f"rollout:  {rollout.describe(rollout.read(client, args.model_name))}")
    print("\n".join(lines))
    return 0


def cmd_promote(args) -> int:
    from flows.promotion import operations as champion_ops

    client, uri = store_client(args)
    previous = champion_ops.promote(client, uri, args.model_name, str(args.version), args.reason,
                                    args.lock_timeout, allow_label_free=args.allow_label_free)
    before = "none" if previous is None else f"v{previous}"
    print(f"{args.model_name}@champion: {before} -> v{args.version} ({args.reason}); "
          f"undo with `cord-ops rollback --model-name {args.model_name}`")
    return 0


def cmd_rollback(args) -> int:
    from flows.promotion import operations as champion_ops

    client, uri = store_client(args)
    current, target = champion_ops.rollback(client, uri, args.model_name, args.reason,
                                            args.lock_timeout,
                                            allow_label_free=args.allow_label_free)
    why = f": {args.reason}" if args.reason else ""
    print(f"{args.model_name}@champion: v{current} -> v{target} (rollback{why})")
    return 0


def add_cli(sub) -> None:
    """Add the operator subcommands to the ``cord-ops`` parser's subparsers."""
    p = sub.add_parser("status", help="champion, health and recent versions of a model")
    p.add_argument("--model-name", required=True, help="registered model name")
    p.add_argument("--limit", type=positive_int, default=10,
                   help="versions shown (default: 10)")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("promote", help="move @champion to a version, after the gate's checks")
    p.add_argument("--model-name", required=True, help="registered model name")
    p.add_argument("--version", required=True, type=positive_int, help="version to promote")
    p.add_argument("--reason", required=True, help="why (recorded as a version tag)")
    p.add_argument("--allow-label-free", action="store_true",
                   help="promote a label-free prior-shift candidate that no labels have "
                        "judged yet (refused without this)")
    add_lock_timeout(p)
    p.set_defaults(func=cmd_promote)

    p = sub.add_parser("rollback", help="return @champion to the previous champion")
    p.add_argument("--model-name", required=True, help="registered model name")
    p.add_argument("--reason", default=None,
                   help="why (recorded as a version tag and in the champion history)")
    p.add_argument("--allow-label-free", action="store_true",
                   help="roll back to a label-free prior-shift candidate that no labels "
                        "have judged yet (refused without this)")
    add_lock_timeout(p)
    p.set_defaults(func=cmd_rollback)


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
