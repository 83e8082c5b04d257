"""Scheduling out of the box: the cord-ops managed Prefect server.

Real processes only: the ``cord-ops`` script, a real ``prefect server`` that it starts
and stops, Prefect's scheduler creating the runs from cron (nothing triggered by hand),
and the MLflow store those runs write to.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from servers import clean_env

from cord_ops import data
from flows.platform import credential

pytestmark = pytest.mark.slow


def cli(command, args, cwd, env, timeout=240) -> subprocess.CompletedProcess:
    return subprocess.run([*command, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def server_record(folder: Path) -> dict:
    return json.loads((folder / "mlruns" / "prefect" / "server.json").read_text())


def wait_for(predicate, timeout: float, what: str, log: Path | None = None, poll: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(poll)
    tail = log.read_text()[-4000:] if log is not None and log.exists() else ""
    pytest.fail(f"{what} not within {timeout:.0f} s\n{tail}")


def test_server_start_status_stop(tmp_path, cord_ops_command):
    work = tmp_path / "work"
    work.mkdir()
    env = clean_env(tmp_path / "home")

    assert cli(cord_ops_command, ["server", "status"], work, env).returncode == 3
    # two starts at once: one server, both report it
    starts = [subprocess.Popen([*cord_ops_command, "server", "start"], cwd=work, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               umask=0o022)
              for _ in range(2)]
    outputs = [p.communicate(timeout=240)[0] for p in starts]
    try:
        assert [p.returncode for p in starts] == [0, 0], outputs
        record = server_record(work)
        pids = {int(re.search(r"pid (\d+)", out).group(1)) for out in outputs}
        assert pids == {record["pid"]}, outputs
        assert sum("started" in out.splitlines()[0] for out in outputs) == 1, outputs
        process = psutil.Process(record["pid"])
        listening = [c.laddr for c in process.net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN]
        assert listening and {a.ip for a in listening} == {"127.0.0.1"}, listening
        assert {a.port for a in listening} == {record["port"]}
        assert (work / "mlruns" / "prefect" / "home" / "prefect.db").exists()  # next to the store
        # the Prefect database, state files and logs: owner-only under the usual umask 022
        state = [work / "mlruns", *(work / "mlruns").rglob("*")]
        assert {"prefect.db", "server.json", "runner.json", "server.log"} <= {p.name for p in state}
        assert [(str(p), oct(p.stat().st_mode)) for p in state if p.stat().st_mode & 0o077] == []
        # a credential the server requires, never printed
        folder = work / "mlruns" / "prefect"
        auth = credential.load(folder)
        assert auth is not None and "api-auth" in {p.name for p in state}
        assert process.environ()[credential.SERVER_SETTING] == auth
        secret = auth.split(":")[1]
        assert not any(secret in text for text in [*process.cmdline(), *outputs])

        status = cli(cord_ops_command, ["server", "status"], work, env)
        assert status.returncode == 0 and f"pid {record['pid']}" in status.stdout
        assert secret not in status.stdout + status.stderr

        # a server killed behind cord-ops' back is reported as not running, and replaced
        process.kill()
        process.wait(10)
        assert cli(cord_ops_command, ["server", "status"], work, env).returncode == 3
        restart = cli(cord_ops_command, ["server", "start"], work, env)
        assert restart.returncode == 0, restart.stderr
        second = server_record(work)
        assert second["pid"] != record["pid"]
        assert credential.load(folder) not in (None, auth)  # a new credential at each start

        stop = cli(cord_ops_command, ["server", "stop"], work, env)
        assert stop.returncode == 0 and f"pid {second['pid']}" in stop.stdout
        assert not psutil.pid_exists(second["pid"]) or (
            psutil.Process(second["pid"]).status() == psutil.STATUS_ZOMBIE)
        assert cli(cord_ops_command, ["server", "status"], work, env).returncode == 3
        assert not credential.auth_file(folder).exists()  # gone with the server
        assert "no managed Prefect server" in cli(cord_ops_command, ["server", "stop"], work,
                                                  env).stdout
    finally:  # a failed assertion must not leave a server (and runner) behind
        cli(cord_ops_command, ["server", "stop"], work, env)


def test_schedule_fires_out_of_the_box_and_stops_cleanly(tmp_path, digits, cord_ops_command,
                                                         mlflow_template_db):
    from mlflow import MlflowClient

    work = tmp_path / "work"
    (work / "mlruns").mkdir(parents=True)
    # an already migrated empty store: the schema migration is not what is tested here
    shutil.copyfile(mlflow_template_db, work / "mlruns" / "mlflow.db")
    batch = data.save_npz(work / "digits.npz", digits.scores, digits.labels, "logits")
    env = clean_env(tmp_path / "home")
    uri = f"sqlite:///{work.resolve() / 'mlruns' / 'mlflow.db'}"
    client = MlflowClient(uri)
    log = tmp_path / "schedule.log"

    started = time.monotonic()
    with open(log, "w") as sink:
        schedule = subprocess.Popen(
            [*cord_ops_command, "schedule", "--cron", "* * * * *", "--data", batch.name,
             "--model-name", "sched"], cwd=work, env=env, stdout=sink,
            stderr=subprocess.STDOUT)
    server_pid = None
    try:
        def finished_run():
            assert schedule.poll() is None, log.read_text()[-4000:]
            experiment = client.get_experiment_by_name("sched")
            if experiment is None:
                return None
            runs = client.search_runs([experiment.experiment_id],
                                      "attributes.status = 'FINISHED'")
            return [r for r in runs if r.data.tags.get("cord.kind") != "monitor"]

        runs = wait_for(finished_run, 150 - (time.monotonic() - started),
                        "a finished scheduled recalibration", log)
        assert time.monotonic() - started <= 150
        server_pid = server_record(work)["pid"]
        text = log.read_text()
        assert "127.0.0.1" in text and "cord-ops server stop" in text  # where, how to stop
        assert "* * * * * 30" in text  # monitoring offset from recalibration
        assert client.get_model_version_by_alias("sched", "champion").run_id in {
            r.info.run_id for r in runs}

        # while it runs, other commands use the managed server, not a temporary one
        own_home = tmp_path / "monitor-home"
        monitor = cli(cord_ops_command, ["monitor", "--data", batch.name, "--model-name",
                                         "sched", "--no-recalibrate"], work,
                      clean_env(own_home))
        assert monitor.returncode == 0, monitor.stderr[-3000:]
        assert "drift:" in monitor.stdout
        assert not (own_home / "prefect.db").exists()
        assert not re.search(r"[Ss]tarting temporary server", monitor.stdout + monitor.stderr)

        # Everything `schedule` started must go with it, except the managed server it
        # started on demand: that one is meant to outlive it until `cord-ops server stop`.
        children = [p for p in psutil.Process(schedule.pid).children(recursive=True)
                    if p.pid != server_pid]
        schedule.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        schedule.wait(timeout=30)
        assert time.monotonic() - signalled <= 5.0, log.read_text()[-3000:]
        assert schedule.returncode == 0, log.read_text()[-3000:]
        gone = psutil.wait_procs(children, timeout=5)[1]
        assert gone == [], f"left running: {[p.cmdline() for p in gone]}"
        assert psutil.pid_exists(server_pid)  # the managed server outlives `schedule`
    finally:
        if schedule.poll() is None:
            schedule.kill()
            schedule.wait()
        stop = cli(cord_ops_command, ["server", "stop"], work, env)
    assert stop.returncode == 0, stop.stderr
    if server_pid is not None:
        assert not psutil.pid_exists(server_pid) or (
            psutil.Process(server_pid).status() == psutil.STATUS_ZOMBIE)
