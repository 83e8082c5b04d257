"""Registry integrity as an operator breaks it: several ``cord-ops recalibrate`` processes at
once, ``kill -9`` at every named step, a tracking store that is down, killed mid-run,
read-only or full. Real sqlite stores, a real ``mlflow server``, a real Prefect server (the
session's), real processes; nothing of MLflow, Prefect or the filesystem is mocked.

The processes are forked by ``launcher.py`` from one interpreter that imported everything
once (see there), which saves a dozen import times on CI's two cores; the orphan-process
and unreachable-store checks run the installed ``cord-ops`` script itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import psutil
import pytest
from fault_site import cord_faults as faults

from flows.platform import checkpoints
from flows.store import owner, registry

pytestmark = [pytest.mark.slow]

LAUNCHER = Path(__file__).with_name("launcher.py")
#: Calibrators of the concurrent runs: distinct fits of one data file and seed.
CALIBRATORS = ("ts", "vs", "ms", "svs", "sms", "irova-ts", "irova", "dir-odir")
GATE_TAGS = (registry.DECISION_TAG, registry.REASON_TAG, registry.CANDIDATE_NLL_TAG,
             registry.CHAMPION_NLL_TAG, registry.CHAMPION_VERSION_TAG)
#: Bound on a failing command (the default --store-timeout); the checks allow CI slack
#: for the process start-up on top.
STORE_TIMEOUT = 60.0


# ---------------------------------------------------------------- helpers
def _env(prefect_api_url: str | None, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL")
           and not k.startswith("CORD_OPS_TEST_")}
    if prefect_api_url:
        env["PREFECT_API_URL"] = prefect_api_url
        # Up to ten processes hit the session's Prefect test server at once; on a loaded
        # machine its sqlite answers 503 for a while, which Prefect's client retries:
        # give it more attempts than the default 5.
        env["PREFECT_CLIENT_MAX_RETRIES"] = "12"
    # The fault site first: every process started with this environment runs its
    # sitecustomize, which installs the test fault hook (tests/fault_site/cord_faults.py).
    env["PYTHONPATH"] = os.pathsep.join([str(faults.SITE), *(p for p in sys.path if p)])
    return {**env, **extra}


def _recalibrate(data: Path, calibrator: str, model: str = "m") -> list[str]:
    return ["recalibrate", "--data", str(data), "--calibrator", calibrator,
            "--model-name", model]


def launch_together(runs: list[tuple[list, dict]], folder: Path) -> list[list[list[list]]]:
    """Start one ``launcher.py`` per (phases, environment) at once (launcher.py says how
    their phases are ordered against each other); returns [exit code, end time] per process
    of each. The first launcher to fail ends the others, which may be waiting for it."""
    started = []
    for phases, env in runs:
        name = folder / f"launcher-{uuid.uuid4().hex[:6]}"
        Path(f"{name}.json").write_text(json.dumps(phases))
        with open(f"{name}.out", "w") as out, open(f"{name}.err", "w") as err:
            started.append((name, subprocess.Popen(
                [sys.executable, str(LAUNCHER), f"{name}.json"], env=env, stdout=out,
                stderr=err, start_new_session=True)))
    deadline = time.monotonic() + 900
    try:
        while any(p.poll() is None for _, p in started):
            failed = [n for n, p in started if p.returncode not in (None, 0)]
            assert not failed, Path(f"{failed[0]}.err").read_text()[-3000:]
            assert time.monotonic() < deadline, "the launchers ran past 900 s"
            time.sleep(0.2)
    finally:
        for _, process in started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    for name, process in started:
        assert process.returncode == 0, Path(f"{name}.err").read_text()[-3000:]
    return [json.loads(Path(f"{name}.out").read_text().strip().splitlines()[-1])
            for name, _ in started]


def launch_timed(phases: list[list[dict]], env: dict, folder: Path) -> list[list[list]]:
    """Run the phases with ``launcher.py``; returns [exit code, end time] per process."""
    (timed,) = launch_together([(phases, env)], folder)
    return timed


def launch(phases: list[list[dict]], env: dict, folder: Path) -> list[list[int]]:
    """Run the phases with ``launcher.py``; returns the exit codes."""
    return [[code for code, _ in phase] for phase in launch_timed(phases, env, folder)]


def fault_time(log: Path) -> float:
    (line,) = [x for x in log.read_text().splitlines() if x.startswith("test fault injected")]
    return float(line.rsplit(" ", 1)[1])


def _spec(argv, cwd: Path, log: Path, **env) -> dict:
    return {"argv": argv, "cwd": str(cwd), "log": str(log), "env": env}


def _logs(paths) -> str:
    return "\n".join(f"--- {p}\n{Path(p).read_text()[-2500:]}" for p in paths)


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


def integrity(db: Path) -> str:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
        (result,) = connection.execute("PRAGMA integrity_check").fetchone()
    connection.close()
    return result


def assert_nothing_pending(client, model: str, experiments: list[str]) -> list:
    """No RUNNING run in ``experiments``, no PENDING logged model, no pending version of
    ``model``. Returns its versions."""
    from mlflow.entities import LoggedModelStatus

    running = client.search_runs(experiments, "attributes.status = 'RUNNING'")
    assert not running, [r.info.run_id for r in running]
    models = client.search_logged_models(experiments)
    assert not [m.model_id for m in models if m.status == LoggedModelStatus.PENDING]
    versions = client.search_model_versions(f"name = '{model}'")
    assert {v.tags.get(registry.REGISTRATION_TAG) for v in versions} == {registry.COMPLETE}
    return versions


def assert_registry_sound(uri: str, model: str = "m"):
    """Nothing pending (:func:`assert_nothing_pending`), a complete champion with every
    gate tag, and the champion the serial gate gives: the passing version with the lowest
    evaluation NLL. Returns (versions, champion)."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    versions = assert_nothing_pending(
        client, model, [client.get_experiment_by_name(model).experiment_id])
    champion = client.get_model_version_by_alias(model, registry.CHAMPION)
    assert all(tag in champion.tags for tag in GATE_TAGS), champion.tags
    assert champion.tags[registry.DECISION_TAG] == "promoted"
    assert client.get_run(champion.run_id).info.status == "FINISHED"
    passing = []
    for v in versions:
        metrics = client.get_run(v.run_id).data.metrics
        if metrics["cord.tpcr"] == 0.0 and metrics["onnx.argmax_agreement"] == 1.0:
            passing.append(float(v.tags[registry.CANDIDATE_NLL_TAG]))
    assert float(champion.tags[registry.CANDIDATE_NLL_TAG]) == min(passing)
    return versions, champion


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MlflowServer:
    """A real ``mlflow server`` (sqlite backend, proxied artifacts) in its own process group,
    restartable on the same database and port."""

    def __init__(self, folder: Path, template_db: Path):
        self.db = folder / "server.db"
        shutil.copyfile(template_db, self.db)  # already migrated: starts faster
        self.folder, self.port = folder, _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.folder / "server.log", "a")  # noqa: SIM115 - closed with the process
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
             f"sqlite:///{self.db}", "--artifacts-destination", str(self.folder / "artifacts"),
             "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        log.close()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.folder / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        pytest.fail(f"mlflow server at {self.url} not healthy after 120 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            except ProcessLookupError:
                pass
        if self.process is not None:
            self.process.wait()


@pytest.fixture
def tmpfs(tmp_path):
    """A small tmpfs mounted for the test (root and mount permission needed: else skip)."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}): "
                    "read-only and full-disk stores need one")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


# ---------------------------------------------------------------- concurrency
def test_concurrent_first_use_of_a_brand_new_machine(tmp_path, digits_file):
    """Eight processes on a folder with no ``mlruns/``, a
    ``PREFECT_HOME`` with no Prefect database and no ``PREFECT_API_URL`` (a new machine,
    container or CI job): the store is created by whichever gets there first, under the
    store lock, and Prefect's database by the first temporary server, under its first-use
    lock; every process then runs on a temporary server of its own."""
    n = len(CALIBRATORS)
    work = tmp_path / "fresh"
    work.mkdir()
    home = tmp_path / "prefect-home"
    logs = [tmp_path / f"run-{c}.log" for c in CALIBRATORS]
    phase = [_spec(_recalibrate(digits_file, c), work, log)
             for c, log in zip(CALIBRATORS, logs, strict=True)]

    (codes,) = launch([phase], _env(None, PREFECT_HOME=str(home)), tmp_path)

    assert codes == [0] * n, _logs(logs)
    assert (home / "prefect.db").is_file()  # the temporary servers' own, not a session's
    db = work / "mlruns" / "mlflow.db"
    assert integrity(db) == "ok"
    versions, champion = assert_registry_sound(f"sqlite:///{db}")
    assert sorted(int(v.version) for v in versions) == list(range(1, n + 1))  # none deleted
    text = _logs(logs)
    assert not _error_lines(text)


@pytest.mark.slow
def test_concurrent_first_use_through_the_managed_server_and_its_warm_runner(
        tmp_path, digits_file, cord_ops_command):
    """The same eight processes on a brand-new folder, once `cord-ops server
    start` has started the managed server and its warm runner there: every command is
    handed to the runner (a forked child each), runs on the managed server, and the
    registry ends as a serial run would leave it."""
    n = len(CALIBRATORS)
    work = tmp_path / "fresh"
    work.mkdir()
    home = tmp_path / "prefect-home"
    env = _env(None, PREFECT_HOME=str(home))
    started = subprocess.run([*cord_ops_command, "server", "start"], cwd=work, env=env,
                             capture_output=True, text=True, timeout=300)
    assert started.returncode == 0, started.stdout + started.stderr
    assert "warm runner: pid" in started.stdout, started.stdout
    logs = [tmp_path / f"run-{c}.log" for c in CALIBRATORS]
    phase = [_spec(_recalibrate(digits_file, c), work, log)
             for c, log in zip(CALIBRATORS, logs, strict=True)]
    try:
        (codes,) = launch([phase], env, tmp_path)
    finally:
        subprocess.run([*cord_ops_command, "server", "stop"], cwd=work, env=env,
                       capture_output=True, text=True, timeout=120)

    assert codes == [0] * n, _logs(logs)
    # no command started a temporary server on its own PREFECT_HOME: all used the managed one
    assert not (home / "prefect.db").exists()
    db = work / "mlruns" / "mlflow.db"
    assert integrity(db) == "ok"
    versions, _ = assert_registry_sound(f"sqlite:///{db}")
    assert sorted(int(v.version) for v in versions) == list(range(1, n + 1))
    assert not _error_lines(_logs(logs))


# ---------------------------------------------------------------- kill -9
#: The kill -9 tests' kills that run on a temporary Prefect server of their own; the others
#: run on the session's server, which spares a server start (and its first use of a new
#: PREFECT_HOME) per kill. No named step is in the temporary server's code: each comes after
#: the server answered, and what takes the server down with a killed command (its
#: PR_SET_PDEATHSIG and the owner watchdog) acts alike at every step, so the first and the
#: last step of the flow stand for the rest.
OWN_SERVER_STEPS = ("start_run", "run_finished")


def _kill_specs(argv: list[str], work: Path, folder: Path, steps, name: str) -> list[dict]:
    """One process per step, killed there, its marked processes listed (launcher.py)."""
    return [{**_spec(argv, work, folder / f"{name}-{step}.log", **{faults.KILL_AT: step}),
             "survivors": str(folder / f"survivors-{name}-{step}.json")} for step in steps]


def _kill_phases(first: dict, shared: list[dict], own: list[dict], rerun: dict,
                 prefect_api_url: str, home: Path, folder: Path):
    """``first``, then the kills of ``shared`` (on the session's Prefect server) and of
    ``own`` (each on a temporary server of its own, in ``home``) all at once, then
    ``rerun``; returns the exit codes of (first, shared, own, rerun)."""
    champion, killed = folder / "phase-first.done", folder / "phase-own.done"
    shared_phases = [{"processes": [first], "done": str(champion)}, shared,
                     {"processes": [rerun], "after": str(killed) if own else None}]
    runs = [(shared_phases, _env(prefect_api_url))]
    if own:
        runs.append(([{"processes": own, "after": str(champion), "done": str(killed)}],
                     _env(None, PREFECT_HOME=str(home))))
    (one, many, again), *alone = launch_together(runs, folder)
    return tuple([code for code, _ in phase]
                 for phase in (one, many, alone[0][0] if own else [], again))


def _survivors(kills: list[dict]) -> dict[str, dict]:
    return {Path(k["survivors"]).stem: json.loads(Path(k["survivors"]).read_text())
            for k in kills}


def _servers_seen(listing: dict) -> bool:
    return any("uvicorn" in " ".join(p["cmdline"]) for p in listing["seen"])


def assert_kills_cleaned_up(shared: list[dict], own: list[dict], home: Path) -> None:
    """Each kill of ``own`` had started its temporary server, marked as its own, and none of
    ``shared`` had (they ran on the session's); 3 s after each kill nothing it started is
    left."""
    on_own, on_shared = _survivors(own), _survivors(shared)
    assert all(_servers_seen(listing) for listing in on_own.values()), on_own
    assert not any(_servers_seen(listing) for listing in on_shared.values()), on_shared
    # the temporary servers' own database, and only when there were any
    assert (home / "prefect.db").is_file() == bool(own)
    left = {name: listing["left"] for name, listing in {**on_own, **on_shared}.items()}
    assert left == {name: [] for name in left}, left


def assert_abandoned(client, experiment: str, killed: int) -> None:
    """One FAILED run per kill, each tagged as abandoned by the clean-up."""
    failed = client.search_runs([experiment], "attributes.status = 'FAILED'")
    assert len(failed) == killed
    assert all(r.data.tags[registry.ERROR_TAG].startswith("abandoned") for r in failed)


def test_kill_9_at_every_named_step_then_one_rerun(tmp_path, digits_file, store_at,
                                                   prefect_api_url):
    """A champion, then one process killed at each named step (all at once: each dead
    holder's lock passes to the next), then one rerun. ``ts`` is the champion; the killed
    runs and the rerun fit ``svs``, which beats it on this split, so the kill after the
    alias moved leaves a pending version holding @champion.

    The kills at :data:`OWN_SERVER_STEPS` run without ``PREFECT_API_URL``, each on a
    temporary Prefect server of its own; the rest on the session's. 3 s after each kill
    no process that carries the killed command's owner marker (its server, anything it
    spawned) may be left."""
    from mlflow import MlflowClient

    work = tmp_path / "work"
    uri = store_at(work / "mlruns" / "mlflow.db")
    home = tmp_path / "prefect-home"
    svs = _recalibrate(digits_file, "svs")
    first = _spec(_recalibrate(digits_file, "ts"), work, tmp_path / "champion.log")
    own = _kill_specs(svs, work, tmp_path, OWN_SERVER_STEPS, "kill")
    shared = _kill_specs(svs, work, tmp_path,
                         [s for s in faults.STEPS if s not in OWN_SERVER_STEPS], "kill")
    shared.append({**_spec(svs, work, tmp_path / "kill-logged-model.log"),
                   "finalize_kill": True,
                   "survivors": str(tmp_path / "survivors-logged-model.json")})
    rerun = _spec(svs, work, tmp_path / "rerun.log")
    logs = [first["log"], *(k["log"] for k in [*shared, *own]), rerun["log"]]

    codes = _kill_phases(first, shared, own, rerun, prefect_api_url, home, tmp_path)

    assert codes == ([0], [-9] * len(shared), [-9] * len(own), [0]), _logs(logs)
    assert len(shared) + len(own) == len(faults.STEPS) + 1  # every step, and the model's
    assert_kills_cleaned_up(shared, own, home)
    assert integrity(work / "mlruns" / "mlflow.db") == "ok"
    versions, champion = assert_registry_sound(uri)
    client = MlflowClient(uri)
    assert len(versions) == 2  # the first champion and the rerun; every killed one undone
    assert client.get_run(champion.run_id).data.tags["cord.calibrator"] == "svs"
    assert "moved back from abandoned" in _logs(logs)  # the alias-holding kill was undone
    assert_abandoned(client, client.get_experiment_by_name("m").experiment_id,
                     len(shared) + len(own))


def test_kill_9_of_a_label_free_registration_at_every_step_it_passes_then_one_rerun(
        tmp_path, digits, digits_file, store_at, prefect_api_url):
    """``monitor --register-candidate`` killed at each named step it passes (all
    but ``alias_moved``: it never moves @champion) and where MLflow marks its logged model
    READY, all at once on the session's Prefect server, then run once more: the store is
    sound, @champion is still the recalibrated version, every killed run is FAILED as
    abandoned and exactly one label-free candidate is registered, the rerun's."""
    from mlflow import MlflowClient

    from flows.monitor.label_free import candidate as label_free_register
    from flows.monitor.label_free import records
    work = tmp_path / "work"
    uri = store_at(work / "mlruns" / "mlflow.db")
    batch = tmp_path / "shifted.npz"
    np.savez(batch, logits=digits.scores[digits.labels <= 2])  # a prior shift: a candidate
    register = ["monitor", "--data", str(batch), "--model-name", "m", "--register-candidate"]
    steps = [s for s in faults.STEPS if s != "alias_moved"]
    first = _spec(_recalibrate(digits_file, "ts"), work, tmp_path / "champion.log")
    shared = _kill_specs(register, work, tmp_path, steps, "label-free")
    shared.append({**_spec(register, work, tmp_path / "label-free-logged-model.log"),
                   "finalize_kill": True,
                   "survivors": str(tmp_path / "survivors-label-free-logged-model.json")})
    rerun = _spec(register, work, tmp_path / "rerun.log")
    logs = [first["log"], *(k["log"] for k in shared), rerun["log"]]

    codes = _kill_phases(first, shared, [], rerun, prefect_api_url, tmp_path / "home", tmp_path)

    # 3: the rerun's batch is an alert (its priors moved), after everything was logged
    assert codes == ([0], [-9] * len(shared), [], [3]), _logs(logs)
    assert_kills_cleaned_up(shared, [], tmp_path / "home")
    assert integrity(work / "mlruns" / "mlflow.db") == "ok"
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("m").experiment_id
    monitoring = client.get_experiment_by_name(records.monitoring_experiment("m"))
    versions = assert_nothing_pending(client, "m", [experiment, monitoring.experiment_id])
    (champion,) = [v for v in versions if v.tags.get(registry.LABEL_FREE_TAG) != "true"]
    (candidate,) = [v for v in versions if v.tags.get(registry.LABEL_FREE_TAG) == "true"]
    assert str(registry.champion_version(client, "m").version) == str(champion.version)
    assert candidate.tags[label_free_register.SOURCE_VERSION_TAG] == str(champion.version)
    assert client.get_run(candidate.run_id).info.status == "FINISHED"
    assert f"prior-shift candidate: registered as v{candidate.version}" in \
        Path(rerun["log"]).read_text()
    assert_abandoned(client, experiment, len(shared))


def test_a_killed_cli_takes_its_temporary_prefect_server_with_it(tmp_path, digits_file,
                                                                 cord_ops_command):
    """No PREFECT_API_URL: the command starts its own Prefect server; kill -9 the command
    after its run started, and no process of it may survive."""
    env = _env(None, **{faults.KILL_AT: "start_run"})

    def marked() -> list[psutil.Process]:
        """What the command started: the processes carrying its owner marker, its pid."""
        found = []
        for process in psutil.process_iter(["cmdline"]):
            try:
                if process.environ().get(owner.OWNER_ENV) == str(cli.pid):
                    found.append(process)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    cli = subprocess.Popen([*cord_ops_command, *_recalibrate(digits_file, "ts")], cwd=tmp_path,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    servers_seen = set()
    while cli.poll() is None:
        servers_seen |= {p.pid for p in marked() if p.pid != cli.pid
                         and "uvicorn" in " ".join(p.info["cmdline"] or [])}
        time.sleep(0.2)
    output = cli.stdout.read()
    assert cli.returncode == -9, output[-3000:]
    assert servers_seen, "no temporary Prefect server was seen: the test proves nothing"
    time.sleep(3)
    survivors = [(p.pid, p.info["cmdline"]) for p in marked()]
    assert not survivors


# ---------------------------------------------------------------- failing stores
def test_unreachable_store_fails_fast_with_one_line(tmp_path, digits_file, cord_ops_command):
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    started = time.monotonic()
    done = subprocess.run([*cord_ops_command, *_recalibrate(digits_file, "ts")], cwd=tmp_path,
                          env=_env(None, MLFLOW_TRACKING_URI=url), capture_output=True,
                          text=True, timeout=300)
    elapsed = time.monotonic() - started
    assert done.returncode == 1
    assert elapsed < STORE_TIMEOUT
    (line,) = _error_lines(done.stderr)
    assert url in line and "unreachable" in line
    assert not (tmp_path / "mlruns").exists()


def test_read_only_store_fails_at_once_and_stays_intact(tmpfs, mlflow_template_db,
                                                         digits_file, prefect_api_url,
                                                         tmp_path):
    store = tmpfs / "mlruns"
    store.mkdir()
    shutil.copyfile(mlflow_template_db, store / "mlflow.db")
    before = (store / "mlflow.db").read_bytes()
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    log = tmp_path / "ro.log"
    started = time.monotonic()

    (codes,) = launch([[_spec(_recalibrate(digits_file, "ts"), tmpfs, log)]],
                      _env(prefect_api_url), tmp_path)

    assert codes == [1], log.read_text()[-3000:]
    assert time.monotonic() - started < STORE_TIMEOUT
    (line,) = _error_lines(log.read_text())
    assert f"sqlite:///{store / 'mlflow.db'}" in line and "not writable" in line
    assert "retry" not in log.read_text().lower()  # not treated as transient
    assert (store / "mlflow.db").read_bytes() == before
    assert integrity(store / "mlflow.db") == "ok"


def test_disk_full_mid_run_records_the_failure_and_registers_nothing(
        tmpfs, mlflow_template_db, digits_file, prefect_api_url, tmp_path):
    from mlflow import MlflowClient

    store = tmpfs / "mlruns"
    store.mkdir()
    shutil.copyfile(mlflow_template_db, store / "mlflow.db")
    with sqlite3.connect(store / "mlflow.db") as connection:  # artifacts inside the tmpfs
        connection.execute("UPDATE experiments SET artifact_location = ? "
                           "WHERE experiment_id = 0", (str(store / "0"),))
    connection.close()
    filler = tmpfs / "filler"
    cache = tmp_path / "cache"  # the journal's fallback, on a disk that is not full
    env = _env(prefect_api_url, XDG_CACHE_HOME=str(cache))
    full = _spec(_recalibrate(digits_file, "ts"), tmpfs, tmp_path / "full.log",
                 **{faults.FAULT: f"log_params=fill:{filler}"})

    ((code, ended),) = launch_timed([[full]], env, tmp_path)[0]

    text = Path(full["log"]).read_text()
    assert code == 1, text[-3000:]
    assert ended - fault_time(Path(full["log"])) < STORE_TIMEOUT
    (line,) = _error_lines(text)
    assert "No space left on device" in line or "disk is full" in line, line
    uri = f"sqlite:///{store / 'mlflow.db'}"
    # The fault fills the tmpfs to its last block, so the store cannot take the failure
    # record (SQLite has no room for its rollback journal) and neither can the journal
    # folder beside it: the record goes to the fallback under XDG_CACHE_HOME, in the
    # folder named by the URI's hash, and the line says so.
    fallback = cache / "cord-ops" / "journal" / hashlib.sha256(uri.encode()).hexdigest()[:16]
    (journaled,) = fallback.glob("*.json")
    assert f"journaled to {journaled} " in line, line
    assert not list(store.glob(".cord-journal/*")), "the full disk took a journal file"
    entry = json.loads(journaled.read_text())
    assert (entry["kind"], entry["status"], entry["tracking_uri"]) == ("run_failed", "FAILED", uri)
    assert "No space left on device" in entry["error"], entry
    filler.unlink()  # the operator frees space; the next command replays any journal

    (codes,) = launch([[_spec(_recalibrate(digits_file, "ts"), tmpfs,
                              tmp_path / "after.log")]], env, tmp_path)

    after = (tmp_path / "after.log").read_text()
    assert codes == [0], after[-3000:]
    assert f"recorded a failure journaled while the store was down: {journaled}" in after, \
        after[-3000:]
    assert integrity(store / "mlflow.db") == "ok"
    versions, _ = assert_registry_sound(uri)
    assert len(versions) == 1
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("m").experiment_id
    (failed,) = client.search_runs([experiment], "attributes.status = 'FAILED'")
    error = failed.data.tags[registry.ERROR_TAG]
    assert "No space left" in error or "disk is full" in error, error
    assert not list((cache / "cord-ops").rglob("*.json"))  # any journal was replayed
    assert not list(store.glob(".cord-journal/*.json"))


# ---------------------------------------------------------------- a real tracking server
def test_real_tracking_server_concurrency_outage_and_replay(tmp_path, mlflow_template_db,
                                                            digits_file, prefect_api_url):
    """Against a real ``mlflow server`` with the real Prefect server (the registry lock is a
    Prefect global concurrency limit): four concurrent runs give the serial result. Then
    the server is killed mid-run: the command fails within the bound with one line naming
    the tracking URI and the journal, and the next command after a restart records it."""
    from mlflow import MlflowClient

    server = MlflowServer(tmp_path, mlflow_template_db)
    server.start()
    try:
        work = tmp_path / "work"
        work.mkdir()
        cache = tmp_path / "cache"
        env = _env(prefect_api_url, MLFLOW_TRACKING_URI=server.url, XDG_CACHE_HOME=str(cache))
        logs = [tmp_path / f"served-{c}.log" for c in CALIBRATORS[:4]]
        concurrent = [_spec(_recalibrate(digits_file, c), work, log)
                      for c, log in zip(CALIBRATORS[:4], logs, strict=True)]
        outage = _spec(_recalibrate(digits_file, "ts"), work, tmp_path / "outage.log",
                       **{faults.FAULT: f"log_artifacts=killpg:{server.process.pid}"})

        (four, ((outage_code, ended),)) = launch_timed([concurrent, [outage]], env, tmp_path)

        assert [code for code, _ in four] == [0] * 4, _logs(logs)
        text = Path(outage["log"]).read_text()
        assert outage_code == 1, text[-3000:]
        assert server.process.poll() is not None  # the fault really killed the server
        assert ended - fault_time(Path(outage["log"])) < STORE_TIMEOUT
        (line,) = _error_lines(text)
        assert server.url in line and "journaled to" in line, line
        journal_files = list((cache / "cord-ops").rglob("*.json"))
        assert len(journal_files) == 1
        entry = json.loads(journal_files[0].read_text())
        server.process.wait()
        server.start()

        (codes,) = launch([[_spec(_recalibrate(digits_file, "ts"), work,
                                  tmp_path / "after.log")]], env, tmp_path)

        assert codes == [0], (tmp_path / "after.log").read_text()[-3000:]
        assert not list((cache / "cord-ops").rglob("*.json"))  # replayed and removed
        versions, _ = assert_registry_sound(server.url)
        assert sorted(int(v.version) for v in versions) == [1, 2, 3, 4, 5]
        failed = MlflowClient(server.url).get_run(entry["run_id"])
        assert failed.info.status == "FAILED"
        assert not failed.data.tags[registry.ERROR_TAG].startswith("abandoned")
    finally:
        server.stop()
    assert integrity(server.db) == "ok"


# ---------------------------------------------------------------- partial artifacts
@pytest.fixture
def fault_hook():
    """The test fault hook installed in this process (the flow runs in it), then removed."""
    previous = checkpoints.install(faults.hook)
    yield
    checkpoints.install(previous)


@pytest.mark.usefixtures("prefect_harness", "fault_hook")
def test_a_partial_artifact_is_never_registered(store, digits_file, monkeypatch):
    """An artifact cut short after logging (what a full disk or an interrupted upload
    leaves): the digest check refuses it, nothing is registered, the run is FAILED with
    the artifact named."""
    from mlflow import MlflowClient

    from flows.recalibrate.flow import RecalibrationError, recalibrate

    monkeypatch.setenv(faults.FAULT,
                       "log_model=truncate:mlruns/*/*/artifacts/state/calibrator.json")
    with pytest.raises(RecalibrationError, match="verify_artifacts") as failure:
        recalibrate(data=str(digits_file), model_name="m")
    assert "state/calibrator.json" in str(failure.value)

    client = MlflowClient(store)
    assert client.search_model_versions("name = 'm'") == []
    (run,) = client.search_runs([client.get_experiment_by_name("m").experiment_id])
    assert run.info.status == "FAILED"
    assert "state/calibrator.json" in run.data.tags[registry.ERROR_TAG]


def test_read_only_store_refuses_a_label_free_candidate_and_stays_intact(
        tmpfs, store, digits, tmp_path, prefect_api_url, cord_ops_command):
    """``monitor --register-candidate`` against a store that became read-only after its
    champion was registered: one error line naming the store, before anything is written
    (no run, no version, no artifact)."""
    from cord_ops import data
    from flows.recalibrate.flow import recalibrate

    recalibrate(data=str(data.save_npz(tmp_path / "d.npz", digits.scores, digits.labels,
                                       "logits")), model_name="m")
    source = Path(store.removeprefix("sqlite:///")).parent
    copy = tmpfs / "mlruns"
    shutil.copytree(source, copy)
    db = copy / "mlflow.db"
    before = db.read_bytes()
    artifacts = sorted(str(p) for p in source.rglob("*") if p.is_file() and p.name != "mlflow.db")
    batch = tmp_path / "shifted.npz"
    np.savez(batch, logits=digits.scores[digits.labels <= 2])  # a prior shift: a candidate
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)

    done = subprocess.run([*cord_ops_command, "monitor", "--data", str(batch), "--model-name",
                           "m", "--register-candidate"], cwd=tmp_path,
                          env=_env(prefect_api_url, MLFLOW_TRACKING_URI=f"sqlite:///{db}"),
                          capture_output=True, text=True, timeout=300)

    assert done.returncode == 1, done.stderr[-3000:]
    (line,) = _error_lines(done.stderr)
    assert f"sqlite:///{db}" in line and "not writable" in line, line
    assert db.read_bytes() == before
    assert integrity(db) == "ok"
    # the champion's artifacts live outside the read-only mount: nothing was added there
    assert sorted(str(p) for p in source.rglob("*")
                  if p.is_file() and p.name != "mlflow.db") == artifacts
