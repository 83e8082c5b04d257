"""The operator's surface as a new user meets it: a temporary Prefect server
that cannot start says why, a taken port or a wrong version is refused before the stack
loads, no MLflow warning on every command, a ``next:`` hint of the run's input kind.
Real processes; nothing of Prefect or MLflow is mocked."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.cli.main import describe_error
from flows.cli.summary import predict_hint
from flows.platform import temporary_server


def test_a_server_that_fails_at_start_up_names_its_own_exception_and_keeps_its_log(
        tmp_path, monkeypatch):
    """A Prefect database file that is not a database (a foreign or damaged file): the
    server's migrations fail inside its start-up. The one line must carry that exception,
    not uvicorn's "Application startup failed", and name the kept log."""
    from prefect.settings import (
        PREFECT_API_DATABASE_CONNECTION_URL,
        PREFECT_API_URL,
        PREFECT_HOME,
        temporary_settings,
    )

    home = tmp_path / "home"
    home.mkdir()
    (home / "prefect.db").write_text("not a database, a note someone left here\n" * 100)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with temporary_settings(updates={PREFECT_HOME: str(home), PREFECT_API_URL: None,
                                     PREFECT_API_DATABASE_CONNECTION_URL:
                                         f"sqlite+aiosqlite:///{home / 'prefect.db'}"}):
        with pytest.raises(temporary_server.TemporaryServerError) as caught:
            with temporary_server.temporary_api(timeout=120):
                pytest.fail("the server came up on a file that is not a database")
    line = describe_error(caught.value, "sqlite:///unused")
    assert "\n" not in line and line.startswith("the temporary Prefect server exited with")
    assert "DatabaseError" in line and "file is not a database" in line, line
    assert "Application startup failed" not in line
    kept = Path(line.rsplit("full log ", 1)[1])
    assert kept.parent == home and kept.is_file()
    assert "Traceback" in kept.read_text()
    assert not (home / f"prefect.db{temporary_server.READY_SUFFIX}").exists()


def test_serve_on_a_taken_port_is_refused_before_anything_loads(tmp_path, cord_ops_command):
    """No store exists in the working folder: a refusal after loading would name the
    store or the model; the port check comes first and creates nothing."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run([*cord_ops_command, "serve", "--model-name", "m", "--port",
                               str(port)], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120)
        elapsed = time.monotonic() - started
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 1, done.stderr[-2000:]
    assert errors == [done.stderr.strip().splitlines()[-1]]
    assert f"--port {port}" in errors[0] and "in use" in errors[0], errors
    assert "uvicorn" not in done.stderr and "Errno 98" not in done.stderr.replace(errors[0], "")
    assert not (tmp_path / "mlruns").exists()
    print(f"refused in {elapsed:.2f} s")


def test_the_pyfunc_flavour_imports_without_mlflow_warnings(tmp_path):
    done = subprocess.run([sys.executable, "-W", "always", "-c", "import flows.pyfunc_model"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "type hints" not in done.stderr and "\x1b[" not in done.stderr, done.stderr


def test_promote_of_a_missing_version_is_refused_before_mlflow_prefect_or_onnx_loads(
        store, tmp_path, cord_ops_command):
    from mlflow import MlflowClient

    client = MlflowClient()
    client.create_registered_model("m")
    client.create_model_version("m", source=str(tmp_path), run_id=None)
    python = Path(cord_ops_command[0]).with_name("python")
    done = subprocess.run([str(python), "-X", "importtime", "-m", "flows.cli.main", "promote",
                           "--model-name", "m", "--version", "99", "--reason", "typo"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert "no version 99" in line and "versions: 1)" in line, line
    imported = {row.rsplit("|", 1)[-1].strip().split(".")[0]
                for row in done.stderr.splitlines() if row.startswith("import time:")}
    # The lookup reads the sqlite store itself (flows.store.reads): no MLflow.
    assert not imported & {"mlflow", "prefect", "onnx", "onnxruntime"}, imported


def test_the_predict_hint_takes_the_kind_of_input_the_run_read(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    assert predict_hint(shards) == "--input FOLDER --output NEW_FOLDER"
    assert predict_hint(tmp_path / "s" / "*.parquet") == "--input FOLDER --output NEW_FOLDER"
    assert predict_hint(tmp_path / "d.parquet") == "--input FILE.parquet --output OUT.parquet"
    assert predict_hint(tmp_path / "d.PQ") == "--input FILE.parquet --output OUT.parquet"
    assert predict_hint(tmp_path / "d.npz") == "--input FILE.npz --output OUT.npz"
    assert predict_hint(None) == "--input FILE.npz --output OUT.npz"


KILLED_COMMAND = """
import os, signal, subprocess, sys, time
from flows.store import owner
owner.watch_command(owner.mark_command())
# A child that ignores SIGTERM, in a session of its own (no group signal, no parent-death
# signal reaches it), and a grandchild of it: what a library may leave behind.
subprocess.Popen([sys.executable, "-c", "import signal, subprocess, sys, time; "
                  "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
                  "time.sleep(300)"], start_new_session=True)
time.sleep(1)
print("spawned", flush=True)
time.sleep(float(sys.argv[1]))  # the test lists what this process started meanwhile
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_what_a_killed_command_started_dies_with_it_marker_and_all(tmp_path):
    import psutil

    def marked(pid: int) -> list[psutil.Process]:
        found = []
        for process in psutil.process_iter():
            try:
                if process.environ().get("CORD_OPS_OWNER") == str(pid):
                    found.append(process)
            except psutil.Error:
                continue
        return found

    command = subprocess.Popen([sys.executable, "-c", KILLED_COMMAND, "3"], cwd=tmp_path,
                               stdout=subprocess.PIPE, text=True)
    assert command.stdout.readline() == "spawned\n"
    seen = marked(command.pid)
    assert len(seen) == 2  # the child and the grandchild, both carrying the marker
    assert command.wait(10) == -9
    time.sleep(3)
    assert [(p.pid, p.cmdline()) for p in marked(command.pid) if p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE] == []
