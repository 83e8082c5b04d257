"""Who may hand the warm runner a command and which requests it runs
(flows/platform/warm_access.py), and the runner's keyed fingerprint.
Unit tests on real sockets, the CLI's real parser and real files; the runner itself is
probed end to end in test_warm_runner.py."""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
from pathlib import Path

import pytest
import second_user

from flows.cli.main import build_parser
from flows.platform import credential, warm, warm_access
from flows.store import owner

COMMANDS = ("recalibrate", "monitor", "demo")
FINGERPRINT = "f" * 64


@pytest.fixture(scope="module")
def parser():
    return build_parser()


def good(**changes) -> dict:
    return {"argv": ["recalibrate", "--data", "batch.npz"], "cwd": "/work", "env": {"A": "b"},
            "fingerprint": FINGERPRINT, "started_ago": 0.25, **changes}


def problem(parser, request, fds=(0, 1, 2)) -> str | None:
    return warm_access.request_problem(request, list(fds), FINGERPRINT, parser, COMMANDS)


def test_a_well_formed_request_for_a_runner_command_is_accepted(parser):
    assert problem(parser, good()) is None
    # global options before the command, as the CLI takes them
    assert problem(parser, good(argv=["--tracking-uri", "sqlite:///x.db", "monitor",
                                      "--data", "b.npz"])) is None
    assert problem(parser, good(argv=["demo"], started_ago=3, env={})) is None
    assert problem(parser, good(started_ago=0)) is None


@pytest.mark.parametrize(("changes", "reason"), [
    ({"argv": ["server", "stop"]}, "not a command the warm runner runs"),
    ({"argv": ["ui", "--port", "5000"]}, "not a command the warm runner runs"),
    ({"argv": ["schedule", "--cron", "* * * * *", "--data", "b.npz"]},
     "not a command the warm runner runs"),
    ({"argv": ["--no-such-option"]}, "not a command the warm runner runs"),
    ({"argv": []}, "not a command the warm runner runs"),
    ({"argv": "recalibrate --data x"}, "argv is not a list of strings"),
    ({"argv": ["recalibrate", None]}, "argv is not a list of strings"),
    ({"argv": ["recalibrate", "--data", "x\0y"]}, "argv is not a list of strings"),
    ({"cwd": "relative/folder"}, "cwd is not an absolute path"),
    ({"cwd": None}, "cwd is not an absolute path"),
    ({"cwd": "/a\0b"}, "cwd is not an absolute path"),
    ({"env": ["A=b"]}, "env is not a mapping of names to strings"),
    ({"env": {"A": 1}}, "env is not a mapping of names to strings"),
    ({"env": {"A=B": "c"}}, "env is not a mapping of names to strings"),
    ({"env": {"": "c"}}, "env is not a mapping of names to strings"),
    ({"env": {"A": "b\0c"}}, "env is not a mapping of names to strings"),
    ({"started_ago": -1.0}, "started_ago is not a non-negative number"),
    ({"started_ago": float("nan")}, "started_ago is not a non-negative number"),
    ({"started_ago": float("inf")}, "started_ago is not a non-negative number"),
    ({"started_ago": True}, "started_ago is not a non-negative number"),
    ({"started_ago": "0"}, "started_ago is not a non-negative number"),
    ({"fingerprint": "e" * 64}, "started from other sources or settings"),
    ({"fingerprint": None}, "started from other sources or settings"),
    ({"fingerprint": FINGERPRINT[:-1]}, "started from other sources or settings"),
])
def test_a_request_of_the_wrong_shape_or_for_another_command_is_refused(parser, changes,
                                                                         reason):
    found = problem(parser, good(**changes))
    assert found is not None and found.startswith(reason), found


def test_an_incomplete_request_or_one_that_is_not_a_mapping_is_refused(parser):
    assert problem(parser, None) == "incomplete request"
    assert problem(parser, good(), fds=(0, 1)) == "incomplete request"
    assert problem(parser, good(), fds=(0, 1, 2, 3)) == "incomplete request"
    assert problem(parser, [good()]) == "not a request"
    assert problem(parser, "recalibrate") == "not a request"
    missing = good()
    del missing["started_ago"]
    assert problem(parser, missing) == "started_ago is not a non-negative number"


def test_the_refusal_lists_the_commands_the_runner_runs(parser):
    assert problem(parser, good(argv=["serve"])) == (
        "not a command the warm runner runs (it runs recalibrate, monitor, demo)")


def test_command_of_reads_the_command_as_the_cli_does_and_swallows_its_messages(parser,
                                                                                  capsys):
    assert warm_access.command_of(parser, ["--tracking-uri", "x", "monitor", "--data", "b"]) \
        == "monitor"
    assert warm_access.command_of(parser, ["--help"]) is None
    assert warm_access.command_of(parser, ["recalibrate"]) is None  # --data is required
    assert capsys.readouterr() == ("", "")
    # a parser whose arguments name no command
    assert warm_access.command_of(argparse.ArgumentParser(), []) is None


def test_the_peer_of_a_socket_of_this_user_is_this_user():
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        assert warm_access.peer_uid(left) == os.geteuid()
        assert warm_access.peer_problem(left) is None


def connect_and_leave(path: str) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)


def test_the_peer_of_a_second_user_is_named_and_refused():
    """The kernel records the connecting process's uid at connect(); the socket's mode,
    wide open here, does not enter into it."""
    folder = Path(tempfile.mkdtemp(prefix="cord-ops-peer-"))
    try:
        folder.chmod(0o755)
        path = str(folder / "sock")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(path)
            os.chmod(path, 0o666)
            listener.listen(1)
            # a group number unlike the uid: the uid, not the gid, is what is compared
            second_user.as_second_user(connect_and_leave, path, gid=second_user.NOBODY - 1)
            conn, _ = listener.accept()
            with conn:
                assert warm_access.peer_uid(conn) == second_user.NOBODY
                assert warm_access.peer_problem(conn) == (
                    f"connected as uid {second_user.NOBODY}, not the runner's uid "
                    f"{os.geteuid()}")
    finally:
        for entry in folder.iterdir():
            entry.unlink()
        folder.rmdir()


def test_a_system_that_cannot_name_the_peer_serves_nobody(monkeypatch):
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    monkeypatch.delattr(socket, "SO_PEERCRED")
    with left, right:
        assert warm_access.peer_uid(left) is None
        assert warm_access.peer_problem(left) == (
            "this system does not say which user connected")


@pytest.mark.parametrize("spare", [-1, 0])
def test_a_frame_longer_than_the_limit_is_refused_unread(spare):
    body = json.dumps(good()).encode()
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        left.sendall(len(body).to_bytes(4, "big") + body)
        if spare < 0:
            with pytest.raises(warm_access.MalformedRequest,
                               match=f"declares {len(body)} bytes, more than {len(body) - 1}"):
                warm._receive(right, limit=len(body) - 1)
        else:
            assert warm._receive(right, limit=len(body)) == (good(), [])
    assert warm_access.MAX_REQUEST_BYTES == 4 << 20


# ---------------------------------------------------------------- the fingerprint
def test_the_fingerprint_is_keyed_with_the_server_credential(tmp_path):
    """runner.json holds the fingerprint: without the key it must say nothing about the
    environment's values, so a password in them cannot be guessed offline from it."""
    folder = credential.private_folder(tmp_path / "prefect")
    env = {"MLFLOW_TRACKING_URI": "http://alice:S3cretPass@host", "PATH": "/bin"}
    assert warm.fingerprint(folder, env) is None  # no server credential: nothing to key

    credential.save(folder, "cord-ops:first")
    first = warm.fingerprint(folder, env)
    assert first == warm.fingerprint(folder, dict(env))  # a function of its inputs
    assert len(first) == 64 and int(first, 16) >= 0
    # the secret's value, not only its presence, changes it
    assert warm.fingerprint(folder, {**env, "MLFLOW_TRACKING_URI":
                                     "http://alice:S3cretPasS@host"}) != first
    # what Prefect, MLflow and cord-ops do not read, and the per-command owner marker, not
    assert warm.fingerprint(folder, {**env, "PATH": "/usr/bin",
                                     owner.OWNER_ENV: "123"}) == first
    # another credential (a restarted server): another fingerprint for the same inputs
    credential.save(folder, "cord-ops:second")
    assert warm.fingerprint(folder, env) != first
