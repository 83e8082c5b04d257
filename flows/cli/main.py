"""The ``cord-ops`` command line: one module per command (:data:`COMMANDS`: recalibrate,
monitor, schedule, predict, demo, ui, server, serve; reproduce / bench from
:mod:`flows.reproduce.cli`, status / promote / rollback from :mod:`flows.cli.operator`,
rollout from :mod:`flows.cli.rollout`), and here what every command shares: the error
contract, the umask and :func:`run` / :func:`main`.

How every command runs (:func:`run`):

1. ``validate``: the command's own check of its files, keys, shapes, classes, options,
   cron expressions and model names (:mod:`flows.inputs`), read once into the command's
   frozen request. Nothing is started, contacted or written before it passes, so a bad
   input exits in about a second.
2. The command's ``run``, handed that request, against the Prefect server
   ``PREFECT_API_URL`` names, else the local server cord-ops manages
   (:mod:`flows.platform.managed_server`) when it is running, else Prefect's temporary
   per-command server (:mod:`flows.cli.context`). MLflow is used through the tracking URI
   resolved once (``--tracking-uri``, else ``MLFLOW_TRACKING_URI``, else
   ``./mlruns/mlflow.db``) and handed down explicitly.
3. Exit status 0, or 1 with one ``error:`` line as the last line of output; a traceback
   only with ``--verbose``. An error that involves the store names its tracking URI.

Prefect, MLflow and onnxruntime are imported inside the command that needs them, not when
the parser is built.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import traceback

from flows import inputs
from flows.cli import demo, monitor, predict, recalibrate, schedule, serve, server, ui
from flows.cli import operator as operator_cli
from flows.cli import parser as cli_parser
from flows.cli import rollout as rollout_cli
from flows.cli.context import Invocation, flow_context
from flows.errors import CordOpsError, in_words
from flows.platform import managed_server, warm
from flows.redact import credentials_to_environment, redact
from flows.reproduce import cli as reproduce_cli
from flows.store import owner, tracking

#: The modules of one command each, in the order ``--help`` lists them: each adds its
#: subparser (``add_parser(sub)``), reads the parsed arguments into its frozen request
#: (``validate(args, invocation)``) and runs it (``run(request)``).
COMMANDS = {module.__name__.rpartition(".")[2]: module for module in (
    recalibrate, monitor, schedule, predict, demo, ui, server, serve)}
#: The umask (octal) for what cord-ops creates, when not owner-only (:func:`private_umask`).
UMASK_ENV = "CORD_OPS_UMASK"
#: Packages whose exceptions mean the tracking store failed (their errors name the URI).
STORE_PACKAGES = ("mlflow", "sqlalchemy", "sqlite3", "requests", "urllib3", "alembic")
#: What the parsed arguments of the commands other modules add carry
#: (:func:`flows.cli.parser.build_parser`): ``validate`` checks the inputs before anything
#: starts, ``prefect`` marks a command that runs Prefect flows; each brings its own
#: ``func``.
HANDLERS = {
    **{name: {"validate": operator_cli.validate} for name in ("status", "promote", "rollback")},
    "rollout": {"validate": rollout_cli.validate},
    **{name: {"prefect": True} for name in ("reproduce", "bench")},
}


def _error(message: str) -> int:
    print(f"error: {redact(message)}", file=sys.stderr, flush=True)
    return 1


def build_parser() -> argparse.ArgumentParser:
    """The ``cord-ops`` parser (:mod:`flows.cli.parser`) of :data:`COMMANDS` and the
    commands of :data:`HANDLERS`."""
    adders = [module.add_parser for module in COMMANDS.values()]
    adders += [reproduce_cli.add_cli, operator_cli.add_cli, rollout_cli.add_cli]
    return cli_parser.build_parser(adders, HANDLERS)


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


def _without_credentials(uri: str, given: str | None) -> str:
    """The command's tracking URI without its ``user:password@``, which goes to MLflow's
    environment variables for this process and those it starts (:mod:`flows.redact`);
    taken from ``MLFLOW_TRACKING_URI`` (``given`` None), that variable, which flow-run
    processes inherit, is rewritten the same way."""
    uri = credentials_to_environment(uri)
    if given is None and os.environ.get("MLFLOW_TRACKING_URI"):
        os.environ["MLFLOW_TRACKING_URI"] = uri
    return uri


def run(args: argparse.Namespace, argv: list[str], started: float, forward: bool = False,
        watch: bool = False) -> int:
    """Validate, then run the command; every failure becomes the last line ``error: ...``.
    ``argv``: the command's arguments, ``started``: its start (``time.perf_counter``).
    With ``forward``, a flow command whose inputs passed goes to the managed server's warm
    runner when one is ready for it (:mod:`flows.platform.warm`: the runner's child parses
    ``argv`` again), else runs here. With ``watch`` (this process is the command's), once
    the inputs passed a watchdog is started that kills what the command started when it
    ends (:func:`flows.store.owner.watch_command`)."""
    given = args.tracking_uri
    uri = given or tracking.tracking_uri()
    try:
        uri = _without_credentials(uri, given)
        command = COMMANDS.get(args.command)
        if command is not None:
            request = command.validate(args, Invocation(uri, given, args.verbose, started))
        else:  # the operator, rollout and reproduce commands read the namespace itself
            args.tracking_uri = uri
            validate = getattr(args, "validate", None)
            if validate is not None:
                validate(args)
        if watch and args.command != "ui":  # the UI replaces this process: nothing to watch
            owner.watch_command(os.environ[owner.OWNER_ENV])
        if forward and args.command in warm.COMMANDS:
            code = warm.forward(managed_server.state_folder(uri), argv,
                                time.perf_counter() - started)
            if code is not None:
                return code
        if command is not None:
            return command.run(request) or 0
        with contextlib.ExitStack() as stack:
            if getattr(args, "prefect", False):  # the command runs Prefect flows
                stack.enter_context(flow_context(Invocation(uri, given, args.verbose,
                                                            started)))
            return args.func(args) or 0
    except KeyboardInterrupt:
        return _error("interrupted")
    except Exception as exc:  # the CLI's contract: one line naming the cause, exit 1
        if args.verbose:
            traceback.print_exc()
        return _error(describe_error(exc, uri))
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
    return run(args, argv, started, forward=forward, watch=owns)


if __name__ == "__main__":
    sys.exit(main())
