"""The user's data stays the user's: atomic writes create files under
the process's umask (never a forced 0644), and the ``cord-ops`` command sets an owner-only
umask for itself and what it starts unless CORD_OPS_UMASK says otherwise. The real runs'
files are checked in test_cli.py (the store, artifacts and reference split) and
test_managed_server.py (the Prefect database, state files and logs); files MLflow copies
into a model keep their source's mode, so the model folder loses the umask's bits before
it is uploaded."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cord_ops.atomic import write_bytes_atomic, write_json_atomic
from flows.cli.main import UMASK_ENV


@pytest.fixture
def umask():
    """Set the process umask for the test; the original is put back afterwards."""
    saved = os.umask(0o022)
    os.umask(saved)
    try:
        yield lambda value: os.umask(value)
    finally:
        os.umask(saved)


@pytest.mark.parametrize("mask, mode", [(0o077, 0o600), (0o027, 0o640), (0o022, 0o644)])
def test_atomic_writes_honour_the_umask(tmp_path, umask, mask, mode):
    umask(mask)
    written = [write_json_atomic(tmp_path / "state" / "record.json", {"pid": 1}),
               write_bytes_atomic(tmp_path / "model.onnx", b"graph")]
    assert [oct(p.stat().st_mode & 0o777) for p in written] == [oct(mode)] * 2
    assert oct((tmp_path / "state").stat().st_mode & 0o777) == oct(0o777 & ~mask)


UMASK_OF_COMMAND = """
import os, sys
from flows.cli.main import main
main(sys.argv[1:], owns_process=True)
print(oct(os.umask(0)))
"""


def _command_umask(shell_umask: int, given: str | None) -> subprocess.CompletedProcess:
    """The umask a command (one that fails its input check at once) leaves in its own
    process, started under ``shell_umask``."""
    env = {k: v for k, v in os.environ.items() if k != UMASK_ENV}
    if given is not None:
        env[UMASK_ENV] = given
    return subprocess.run([sys.executable, "-c", UMASK_OF_COMMAND, "ui", "--port", "0"],
                          env=env, umask=shell_umask, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("shell, given, expected", [
    (0o022, None, "0o77"), (0o027, None, "0o77"), (0o077, "0007", "0o7")])
def test_the_command_is_owner_only_by_default_and_takes_a_shared_umask(shell, given,
                                                                        expected):
    done = _command_umask(shell, given)
    assert done.stdout.strip().splitlines()[-1] == expected, done.stderr[-2000:]


def test_a_bad_umask_setting_is_refused_in_one_line():
    done = _command_umask(0o022, "rw-r-----")
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: {UMASK_ENV}='rw-r-----': expected an octal umask such as 0077 (owner only, "
        "the default) or 0007 (owner and group)")


def test_copied_model_files_lose_what_the_umask_takes_away(tmp_path, umask):
    from flows.store.tracking import current_umask, honour_umask

    model = tmp_path / "model"
    (model / "code").mkdir(parents=True)
    copied = model / "code" / "pyfunc_code.py"
    copied.write_text("# copied with its mode, as MLflow copies a model's code file\n")
    for path, mode in ((copied, 0o644), (model / "code", 0o755), (model, 0o755)):
        path.chmod(mode)
    umask(0o077)
    assert current_umask() == 0o077
    honour_umask(model)
    assert [oct(p.stat().st_mode & 0o777) for p in (copied, model / "code", model)] == [
        "0o600", "0o700", "0o700"]
