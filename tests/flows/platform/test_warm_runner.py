"""The warm runner beside the managed Prefect server (flows/platform/warm.py), broken as an operator
would break it: real ``cord-ops`` processes, a real managed server and runner, a real
MLflow store, and kill -9 / SIGTERM sent to the command while its work runs.

Which process ran a recalibration is read from the run's owner tags (``cord.owner.pid``),
which the flow writes from the process that does the work.

A second local account (uid 65534, :mod:`second_user`) probes the same
server and runner: it reaches the work folder, as other accounts reach a home folder on
many systems, and must get no further.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import second_user
from servers import clean_env

from cord_ops import data
from flows.platform import credential
from flows.store import owner

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def warm(tmp_path_factory, cord_ops_command, mlflow_template_db):
    """A work folder with a migrated store, a managed server and its ready runner, shared
    by this module's tests (each uses its own model name); the last test stops it. The
    work folder is one every local account may enter and list (pytest's own temporary
    folders are not), so that only cord-ops' own modes stand between them and the state."""
    tmp_path = tmp_path_factory.mktemp("warm")
    work = Path(tempfile.mkdtemp(prefix="cord-ops-warm-"))
    work.chmod(0o755)
    (work / "mlruns").mkdir(parents=True)
    shutil.copyfile(mlflow_template_db, work / "mlruns" / "mlflow.db")
    env = clean_env(tmp_path / "home")
    started = subprocess.run([*cord_ops_command, "server", "start"], cwd=work, env=env,
                             capture_output=True, text=True, timeout=300)
    assert started.returncode == 0, started.stdout + started.stderr
    assert "warm runner: pid" in started.stdout, started.stdout
    record = json.loads((work / "mlruns" / "prefect" / "runner.json").read_text())
    assert record["ready"]
    try:
        yield work, env, record
    finally:
        subprocess.run([*cord_ops_command, "server", "stop"], cwd=work, env=env,
                       capture_output=True, text=True, timeout=120)
        shutil.rmtree(work, ignore_errors=True)


def uri(work: Path) -> str:
    return f"sqlite:///{work.resolve() / 'mlruns' / 'mlflow.db'}"


def runs_of(work: Path, model: str):
    from mlflow import MlflowClient

    client = MlflowClient(uri(work))
    experiment = client.get_experiment_by_name(model)
    if experiment is None:
        return []
    return client.search_runs([experiment.experiment_id])


def owner_pid(run) -> int:
    return int(run.data.tags[owner.PID_TAG])


def slow_data(folder: Path) -> Path:
    """Logits big enough that a Dir-ODIR recalibration runs for several seconds."""
    rng = np.random.default_rng(3)
    z = rng.normal(size=(6000, 20)) * 2.5
    y = (z + rng.gumbel(size=z.shape) * 2.0).argmax(axis=1)
    return data.save_npz(folder / "slow.npz", z, y, "logits")


def wait_for_run(work: Path, model: str, process: subprocess.Popen, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        found = [r for r in runs_of(work, model) if owner.PID_TAG in r.data.tags]
        if found:
            return found[0]
        time.sleep(0.1)
    pytest.fail(f"no run of {model} within {timeout} s")


def test_commands_run_in_the_runner_with_their_own_output_and_status(warm, cord_ops_command,
                                                                    digits):
    work, env, record = warm
    path = data.save_npz(work / "digits.npz", digits.scores, digits.labels, "logits")

    done = subprocess.Popen([*cord_ops_command, "recalibrate", "--data", path.name,
                             "--model-name", "warm"], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = done.communicate(timeout=300)
    assert done.returncode == 0, out + err
    assert "eta* =" in out and "time:" in out and "-> warm@champion" in out
    (run,) = runs_of(work, "warm")
    assert run.info.status == "FINISHED"
    # forked by the runner: neither the command's process nor the runner itself
    assert owner_pid(run) not in (done.pid, record["pid"])

    # bad input never reaches the runner: answered by the command itself, at once
    start = time.monotonic()
    bad = subprocess.run([*cord_ops_command, "recalibrate", "--data", "missing.npz"], cwd=work,
                         env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and time.monotonic() - start < 10
    assert bad.stderr.strip().splitlines()[-1] == (
        "error: missing.npz: no such file (given as --data)")

    # other Prefect/MLflow settings than the runner's: the command runs in-process
    other = subprocess.Popen([*cord_ops_command, "recalibrate", "--data", path.name,
                              "--model-name", "cold"], cwd=work,
                             env={**env, "MLFLOW_HTTP_REQUEST_TIMEOUT": "77"},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = other.communicate(timeout=300)
    assert other.returncode == 0, err[-3000:]
    (cold,) = runs_of(work, "cold")
    assert owner_pid(cold) == other.pid


def test_predict_and_status_go_to_the_runner(warm, cord_ops_command, digits):
    """Their work takes milliseconds; the command process itself checks the inputs and
    hands over, never importing MLflow or onnxruntime (seconds of start-up)."""
    work, env, _ = warm
    # The console script's own interpreter path: the runner's fingerprint names it.
    python = Path(cord_ops_command[0]).read_text().splitlines()[0].removeprefix("#!").strip()
    path = data.save_npz(work / "batch.npz", digits.scores, digits.labels, "logits")
    recalibrated = subprocess.run([*cord_ops_command, "recalibrate", "--data", path.name,
                                   "--model-name", "quick"], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=300)
    assert recalibrated.returncode == 0, recalibrated.stderr[-3000:]
    for argv, said in ((["status", "--model-name", "quick"], "champion: v1"),
                       (["predict", "--model", "models:/quick@champion", "--input", path.name,
                         "--output", "out.npz"], f"wrote {digits.n} rows x 10 classes")):
        done = subprocess.run([python, "-X", "importtime", "-m", "flows.cli.main", *argv],
                              cwd=work, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        assert said in done.stdout, done.stdout
        imported = {row.rsplit("|", 1)[-1].strip().split(".")[0]
                    for row in done.stderr.splitlines() if row.startswith("import time:")}
        assert not imported & {"mlflow", "onnxruntime", "prefect"}, argv
    assert (work / "out.npz").is_file()


def test_kill_9_of_the_command_kills_its_work_and_the_next_run_cleans_up(warm, cord_ops_command):
    work, env, record = warm
    path = slow_data(work)
    command = [*cord_ops_command, "recalibrate", "--data", path.name, "--model-name", "k9",
               "--calibrator", "dir-odir"]
    victim = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    run = wait_for_run(work, "k9", victim)
    worker = owner_pid(run)
    assert worker != victim.pid and psutil.pid_exists(worker)
    victim.kill()
    victim.wait(10)
    gone = psutil.wait_procs([psutil.Process(worker)], timeout=10)[1] if psutil.pid_exists(
        worker) else []
    assert gone == [], "the forked work outlived its killed command"
    assert psutil.pid_exists(record["pid"])  # the runner itself is unharmed

    again = subprocess.run([*cord_ops_command, "recalibrate", "--data", path.name,
                            "--model-name", "k9", "--calibrator", "ts"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    statuses = {r.info.run_id: r.info.status for r in runs_of(work, "k9")}
    assert statuses[run.info.run_id] == "FAILED"  # the dead owner's run, cleaned up
    assert sorted(statuses.values()) == ["FAILED", "FINISHED"]


def test_sigterm_to_the_command_stops_its_work_like_an_in_process_command(warm,
                                                                         cord_ops_command):
    work, env, _ = warm
    path = slow_data(work)
    victim = subprocess.Popen([*cord_ops_command, "recalibrate", "--data", path.name,
                               "--model-name", "term", "--calibrator", "dir-odir"], cwd=work,
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = owner_pid(wait_for_run(work, "term", victim))
    victim.send_signal(signal.SIGTERM)
    victim.wait(15)
    assert victim.returncode == -signal.SIGTERM  # what the in-process command would return
    assert not psutil.pid_exists(worker) or psutil.wait_procs(
        [psutil.Process(worker)], timeout=10)[1] == []


def state(work: Path) -> Path:
    return work / "mlruns" / "prefect"


def request(fingerprint: str, argv: list[str], **changes) -> bytes:
    """A request as :func:`flows.platform.warm.forward` frames it, with ``changes``."""
    return json.dumps({"argv": argv, "cwd": "/", "env": {}, "fingerprint": fingerprint,
                       "started_ago": 0.0, **changes}).encode()


def probe_server(paths: list[str], port: int) -> dict:
    """What the second account gets from the state files and the server's API."""
    flows, created = second_user.http_request(port, "POST", "/api/flows/", {"name": "intruder"})
    flow_id = created.get("id") if isinstance(created, dict) else None
    return {
        "files": second_user.open_each(paths),
        "health": second_user.http_request(port, "GET", "/api/health")[0],
        "deployments": second_user.http_request(port, "POST", "/api/deployments/filter", {})[0],
        "flows": flows,
        "flow_run": second_user.http_request(port, "POST", "/api/flow_runs/", {
            "flow_id": flow_id or "00000000-0000-0000-0000-000000000000",
            "name": "intruder", "parameters": {"data": "/etc/shadow"}})[0],
    }


def test_a_second_user_can_neither_read_the_state_nor_use_the_server(warm):
    work, _, _ = warm
    folder = state(work)
    port = json.loads((folder / "server.json").read_text())["port"]
    names = ["server.json", "api-auth", "runner.json", "server.log", "runner.log",
             "home/prefect.db"]

    found = second_user.as_second_user(probe_server, [str(folder / n) for n in names], port)

    assert found["health"] == 200  # it reaches the port...
    # ...and nothing behind it: no deployment read, no flow, no flow run created
    assert (found["deployments"], found["flows"], found["flow_run"]) == (401, 401, 401)
    assert found["files"] == {str(folder / n): "PermissionError" for n in names}
    # not only the folder: each file is the owner's alone
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert {n: stat.S_IMODE((folder / n).stat().st_mode) for n in names[:5]} == dict.fromkeys(
        names[:5], 0o600)
    auth = credential.authorization(credential.load(folder))
    assert second_user.http_request(port, "POST", "/api/flows/filter", {}, auth)[0] == 200
    # what every account reads of any process: the runner's command line, without its
    # fingerprint (which is keyed with the credential anyway)
    runner = json.loads((folder / "runner.json").read_text())
    assert not any(runner["fingerprint"] in part
                   for part in psutil.Process(runner["pid"]).cmdline())


def test_the_runner_refuses_another_uid(warm):
    """The way to the socket opened to every account, as a wrong umask, a ``chmod`` or a
    shared group would: the runner's uid check must hold on its own."""
    work, _, record = warm
    folder = state(work)
    sock = folder / "runner.sock"
    modes = {path: stat.S_IMODE(path.stat().st_mode) for path in (folder, sock)}
    folder.chmod(0o711)
    sock.chmod(0o666)
    try:
        found = second_user.as_second_user(
            second_user.unix_request, str(sock),
            request(record["fingerprint"], ["recalibrate", "--data", "/nonexistent.npz"]))
    finally:
        for path, mode in modes.items():
            path.chmod(mode)
    assert found["connect"] is None  # it got through to the runner, which refused it
    assert found["reply"] == {"refused": f"connected as uid {second_user.NOBODY}, not the "
                                         f"runner's uid {os.geteuid()}"}
    assert psutil.pid_exists(record["pid"])
    assert f"refused a request: connected as uid {second_user.NOBODY}" in (
        folder / "runner.log").read_text()


def raw_reply(path: str, data: bytes, close_after_send: bool = False) -> dict | None:
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(path)
        sock.sendall(data)
        if close_after_send:
            sock.shutdown(socket.SHUT_WR)
        return second_user.read_reply(sock)


def test_the_runner_survives_malformed_messages(warm):
    work, _, record = warm
    sock = str(state(work) / "runner.sock")
    good = json.loads(request(record["fingerprint"], ["recalibrate", "--data", "x.npz"]))
    framed = {
        "not JSON": b"{nope",
        "not UTF-8": b"\xff\xfe\x00",
        "a list": b"[1, 2]",
        "nested past the parser's depth": b"[" * 200_000,
        "argv not strings": json.dumps({**good, "argv": ["recalibrate", 1]}).encode(),
        "env a list": json.dumps({**good, "env": ["PATH=/bin"]}).encode(),
        "a relative working folder": json.dumps({**good, "cwd": "work"}).encode(),
        "a command it does not run": json.dumps({**good, "argv": ["server", "stop"]}).encode(),
        "arguments cord-ops rejects": json.dumps({**good, "argv": ["--no-such"]}).encode(),
    }
    for what, payload in framed.items():
        found = second_user.unix_request(sock, payload)
        assert set(found["reply"] or {}) == {"refused"}, (what, found)
    # not even a frame: an HTTP request's first bytes read as a 1.2 GB length
    assert "declares" in raw_reply(sock, b"GET / HTTP/1.0\r\n\r\n")["refused"]
    # a frame declaring 4 GiB, then nothing: refused unread, nothing allocated
    assert "declares 4294967295 bytes" in raw_reply(sock, struct.pack("!I", 2**32 - 1),
                                                     close_after_send=True)["refused"]
    assert raw_reply(sock, b"", close_after_send=True) == {"refused": "incomplete request"}

    assert psutil.pid_exists(record["pid"])
    assert json.loads((state(work) / "runner.json").read_text())["pid"] == record["pid"]
    # still serving: a well-formed request is read and judged
    wrong = second_user.unix_request(sock, request("0" * 64, ["recalibrate", "--data", "x"]))
    assert wrong["reply"] == {"refused": "started from other sources or settings"}


def test_server_stop_stops_the_runner(warm, cord_ops_command):
    work, env, record = warm
    status = subprocess.run([*cord_ops_command, "server", "status"], cwd=work, env=env,
                            capture_output=True, text=True, timeout=60)
    assert f"warm runner: pid {record['pid']}" in status.stdout, status.stdout
    stop = subprocess.run([*cord_ops_command, "server", "stop"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert stop.returncode == 0, stop.stderr
    assert f"warm runner (pid {record['pid']})" in stop.stdout, stop.stdout
    assert "Prefect server (pid " in stop.stdout, stop.stdout
    assert not psutil.pid_exists(record["pid"]) or psutil.Process(
        record["pid"]).status() == psutil.STATUS_ZOMBIE
    assert not (work / "mlruns" / "prefect" / "runner.sock").exists()
