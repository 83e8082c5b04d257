"""The errors cord-ops raises for an operator share one base, and the command line tells
them from faults by that base alone: its own message for one of them, the fault in words
(never its class name; a file error names its file) for anything else."""

from __future__ import annotations

import pytest

from flows.cli.main import describe_error
from flows.errors import CordOpsError
from flows.inputs import InputError
from flows.platform.managed_server import ServerError
from flows.platform.temporary_server import TemporaryServerError
from flows.promotion.champion import ChampionUnhealthyError
from flows.promotion.operations import PromotionRefused
from flows.recalibrate.flow import RecalibrationError
from flows.serve.contract import ScoringInputError
from flows.serve.served_model import VersionRejected
from flows.store.lock import LockTimeout
from flows.store.reference import ReferenceUnavailable
from flows.store.tracking import StoreError

URI = "sqlite:///nowhere/mlflow.db"


@pytest.mark.parametrize("error, builtin", [
    (InputError("--data: no such file"), ValueError),
    (StoreError("store unreachable"), RuntimeError),
    (ServerError("see server.log"), RuntimeError),
    (TemporaryServerError("exited with 1"), RuntimeError),
    (PromotionRefused("v3 is not READY"), RuntimeError),
    (RecalibrationError("gate", ValueError("bad"), None), RuntimeError),
    (ChampionUnhealthyError("m", "2", "graph unreadable"), RuntimeError),
    (LockTimeout("registry lock of model 'm' still held by run r after 1 s"), RuntimeError),
    (ReferenceUnavailable("run r logged no evaluation dataset input"), LookupError),
    (ScoringInputError("bad_shape", "input: row 3 has 9 values but row 0 has 10"), ValueError),
    (VersionRejected("v2: repaired rows do not sum to 1 on the probe batch"), RuntimeError),
])
def test_operator_errors_print_their_own_line(error, builtin):
    assert isinstance(error, CordOpsError) and isinstance(error, builtin)
    assert describe_error(error, URI) == str(error).splitlines()[0]
    assert type(error).__name__ not in describe_error(error, URI)


def test_any_other_exception_is_said_in_words_without_its_class_name(tmp_path):
    assert describe_error(ValueError("expected 10 columns"), URI) == "expected 10 columns"
    assert describe_error(KeyError("x"), URI) == "missing key 'x'"
    assert describe_error(MemoryError(), URI) == "out of memory"
    assert describe_error(RuntimeError(), URI) == \
        "failed without a message (--verbose shows the traceback)"
    # A file error names the file, whichever way it was raised.
    try:
        open(tmp_path / "absent.npz", "rb")
    except OSError as exc:
        missing = exc
    assert describe_error(missing, URI) == f"{tmp_path / 'absent.npz'}: No such file or directory"
    moved = OSError(18, "Invalid cross-device link", "/a/x.npz", None, "/b/x.npz")
    assert describe_error(moved, URI) == "/a/x.npz -> /b/x.npz: Invalid cross-device link"
    for error in (ValueError("v"), KeyError("k"), missing, moved, MemoryError("m")):
        assert type(error).__name__ not in describe_error(error, URI)
        assert "Error" not in describe_error(error, URI)
