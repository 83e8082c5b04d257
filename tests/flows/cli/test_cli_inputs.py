"""Bad input fails first, fast and in one line: the real ``cord-ops`` script in a clean
folder with no PREFECT_API_URL, so any Prefect server it started would be a temporary one
(8-15 s, and a ``prefect.db`` in its PREFECT_HOME).

Each case asserts the exit status, the last line of output, no traceback, a wall and CPU
time far below a Prefect start-up, an untouched PREFECT_HOME (no server was started) and
no store created as a side effect.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from cord_ops import data

#: Far below the 8-15 s of a temporary Prefect server; covers the interpreter, numpy and
#: scikit-learn imports (about 2 s of CPU) on a 2-core runner.
MAX_WALL_S = 6.0
#: The same promise in CPU seconds, which a machine shared with other jobs does not
#: inflate: importing Prefect and starting its server alone costs more than this.
MAX_CPU_S = 4.0
#: Above this load per core, wall times say more about the neighbours than about the
#: command, so only the CPU bound is checked.
BUSY_LOAD_PER_CORE = 2.0


def run_cli(command: list[str], args: list[str], cwd: Path, home: Path):
    """(completed process, (wall seconds, CPU seconds of the command and its children))."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    env["PREFECT_HOME"] = str(home)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([*command, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return done, (wall, cpu)


@pytest.fixture
def folder(tmp_path, digits) -> Path:
    """A clean working folder with a good file, and PREFECT_HOME beside it."""
    work = tmp_path / "work"
    work.mkdir()
    data.save_npz(work / "ok.npz", digits.scores, digits.labels, "logits")
    (tmp_path / "prefect-home").mkdir()
    return work


def assert_fails_fast(done, times: tuple[float, float], folder: Path, status: int,
                      *fragments: str) -> str:
    output = (done.stdout + done.stderr).strip()
    last = output.splitlines()[-1]
    assert done.returncode == status, output[-2000:]
    assert done.stderr.strip().splitlines()[-1] == last  # the error line is the very last
    assert last.startswith("error: "), output[-2000:]
    for fragment in fragments:
        assert fragment in last, last
    assert "Traceback" not in output
    wall, cpu = times
    assert cpu < MAX_CPU_S, f"{cpu:.1f} s of CPU: {last}"
    if os.getloadavg()[0] / (os.cpu_count() or 1) < BUSY_LOAD_PER_CORE:
        assert wall < MAX_WALL_S, f"{wall:.1f} s: {last}"
    assert list((folder.parent / "prefect-home").iterdir()) == []  # no Prefect server ran
    return last


def _bad_files(folder: Path, digits: data.Dataset) -> None:
    (folder / "notes.npz").write_text("not an archive\n")
    (folder / "model.onnx").write_bytes(b"")  # only its existence is checked up front
    scores = np.array(digits.scores)
    scores[7] = np.inf
    np.savez(folder / "inf_row.npz", logits=scores, labels=digits.labels)
    np.savez(folder / "no_labels.npz", logits=digits.scores)
    np.savez(folder / "three_classes.npz", logits=digits.scores[:, :3],
             labels=np.minimum(digits.labels, 2))


CASES = {
    "missing data": (["recalibrate", "--data", "missing.npz"], 1,
                     ["missing.npz: no such file", "--data"]),
    "not an npz": (["recalibrate", "--data", "notes.npz"], 1,
                   ["notes.npz: not an .npz archive"]),
    "non-finite row": (["recalibrate", "--data", "inf_row.npz"], 1,
                       ["inf_row.npz", "logits", "row 7"]),
    "missing key": (["demo", "--data", "no_labels.npz"], 1,
                    ["no_labels.npz: missing array 'labels'"]),
    "eval classes": (["recalibrate", "--data", "ok.npz", "--eval-data", "three_classes.npz"], 1,
                     ["three_classes.npz: has 3 classes but ok.npz has 10"]),
    "bad fraction": (["recalibrate", "--data", "ok.npz", "--fraction", "1.5"], 1,
                     ["--fraction", "(0, 1)", "1.5"]),
    "unknown calibrator": (["recalibrate", "--data", "ok.npz", "--calibrator", "platt"], 2,
                           ["--calibrator", "invalid choice: 'platt'"]),
    "cron out of range": (["schedule", "--cron", "61 * * * *", "--data", "ok.npz"], 1,
                          ["--cron '61 * * * *'", "minute '61' is not in 0-59"]),
    "cron fields": (["schedule", "--cron", "0 3 * * *", "--monitor-cron", "* * *",
                     "--data", "ok.npz"], 1, ["--monitor-cron '* * *': has 3 fields"]),
    "schedule missing data": (["schedule", "--cron", "* * * * *", "--data", "gone.npz"], 1,
                              ["gone.npz: no such file"]),
    "schedule bad data": (["schedule", "--cron", "* * * * *", "--data", "inf_row.npz"], 1,
                          ["inf_row.npz", "row 7"]),
    "schedule label-free file": (["schedule", "--cron", "0 3 * * *", "--data", "ok.npz",
                                  "--label-free-data", "ok.npz"], 1,
                                 ["--label-free-data ok.npz: expected a glob pattern"]),
    "monitor without a store": (["monitor", "--data", "ok.npz"], 1,
                                ["no MLflow store at sqlite:///", "/work/mlruns/mlflow.db"]),
    "predict without a store": (["predict", "--model", "models:/cord-ops@champion",
                                 "--input", "ok.npz", "--output", "out.npz"], 1,
                                ["no MLflow store at sqlite:///", "--tracking-uri"]),
    "predict missing onnx": (["predict", "--model", "nope.onnx", "--input", "ok.npz",
                              "--output", "out.npz"], 1, ["nope.onnx: no such file"]),
    "predict output folder": (["predict", "--model", "model.onnx", "--input", "ok.npz",
                               "--output", "no/such/dir/out.npz"], 1, ["does not exist"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_fails_in_one_line_before_anything_starts(case, folder, digits,
                                                            cord_ops_command):
    _bad_files(folder, digits)
    args, status, fragments = CASES[case]
    done, wall = run_cli(cord_ops_command, args, folder, folder.parent / "prefect-home")
    last = assert_fails_fast(done, wall, folder, status, *fragments)
    assert "pickle" not in last
    assert not (folder / "mlruns").exists()  # no store created by a failed command
    assert not (folder / "out.npz").exists()


def test_wrong_model_names_the_store_and_what_it_holds(folder, cord_ops_command,
                                                       mlflow_template_db, tmp_path):
    from mlflow import MlflowClient

    store = tmp_path / "elsewhere"
    store.mkdir()
    shutil.copyfile(mlflow_template_db, store / "mlflow.db")
    uri = f"sqlite:///{store / 'mlflow.db'}"
    client = MlflowClient(uri)
    client.create_registered_model("cord-ops-demo")
    client.create_registered_model("no-champion")
    home = folder.parent / "prefect-home"

    # the README's old example: the demo registers cord-ops-demo, not cord-ops
    done, wall = run_cli(cord_ops_command, ["--tracking-uri", uri, "predict", "--model",
                                            "models:/cord-ops@champion", "--input", "ok.npz",
                                            "--output", "out.npz"], folder, home)
    assert_fails_fast(done, wall, folder, 1, "model 'cord-ops' is not registered in " + uri,
                      "(registered: cord-ops-demo, no-champion)")

    # --tracking-uri after the command name works too; monitor needs a champion
    done, wall = run_cli(cord_ops_command, ["monitor", "--data", "ok.npz", "--model-name",
                                            "no-champion", "--tracking-uri", uri], folder, home)
    assert_fails_fast(done, wall, folder, 1, f"model 'no-champion' has no @champion in {uri}")
    assert not (folder / "mlruns").exists()


def test_verbose_shows_the_traceback_and_still_ends_with_the_error(folder, cord_ops_command):
    done, _ = run_cli(cord_ops_command, ["--verbose", "recalibrate", "--data", "missing.npz"],
                      folder, folder.parent / "prefect-home")
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "error: missing.npz: no such file (given as --data)")


def test_a_tracking_server_that_is_down_is_named_at_once(folder, cord_ops_command):
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{sock.getsockname()[1]}"
    done, wall = run_cli(cord_ops_command, ["monitor", "--data", "ok.npz", "--tracking-uri", uri],
                         folder, folder.parent / "prefect-home")
    assert_fails_fast(done, wall, folder, 1, f"tracking store {uri} is unreachable")


def test_data_the_champion_cannot_read_is_refused(folder, digits, cord_ops_command,
                                                  mlflow_template_db, tmp_path):
    from mlflow import MlflowClient
    from scipy.special import softmax

    store = tmp_path / "store"
    store.mkdir()
    shutil.copyfile(mlflow_template_db, store / "mlflow.db")
    uri = f"sqlite:///{store / 'mlflow.db'}"
    client = MlflowClient(uri)
    run = client.create_run("0")
    client.log_param(run.info.run_id, "n_classes", "10")  # what a recalibration records
    client.set_terminated(run.info.run_id)
    client.create_registered_model("ten")
    version = client.create_model_version("ten", f"runs:/{run.info.run_id}/model",
                                          run.info.run_id, tags={"cord.input_kind": "logits"})
    client.set_registered_model_alias("ten", "champion", version.version)
    np.savez(folder / "three.npz", logits=digits.scores[:, :3],
             labels=np.minimum(digits.labels, 2))
    np.savez(folder / "probs.npz", probs=softmax(digits.scores, axis=1), labels=digits.labels)
    home = folder.parent / "prefect-home"

    for command in (["recalibrate", "--data", "three.npz"], ["monitor", "--data", "three.npz"]):
        done, wall = run_cli(cord_ops_command, [*command, "--model-name", "ten",
                                                "--tracking-uri", uri], folder, home)
        assert_fails_fast(done, wall, folder, 1, "three.npz: has 3 classes but 'ten'@champion",
                          f"in {uri}) reads 10")
    done, wall = run_cli(cord_ops_command, ["monitor", "--data", "probs.npz", "--model-name",
                                            "ten", "--tracking-uri", uri], folder, home)
    assert_fails_fast(done, wall, folder, 1, "probs.npz: holds probs but 'ten'@champion",
                      "reads logits")

    # predict checks the input against the registered version's K and input kind before it
    # downloads anything (this version's artifact does not even exist)
    scores = np.array(digits.scores)
    scores[7, 3] = np.nan
    np.savez(folder / "nan_row.npz", logits=scores)
    cases = {"three.npz": "expected 10 classes (columns), got 3", "nan_row.npz": "row 7",
             "probs.npz": "probs"}
    for name, fragment in cases.items():
        done, wall = run_cli(cord_ops_command, ["predict", "--model", "models:/ten@champion",
                                                "--input", name, "--output", "out.npz",
                                                "--tracking-uri", uri], folder, home)
        assert_fails_fast(done, wall, folder, 1, name, fragment,
                          "'ten' v1 reads 10 classes of logits")
        assert not (folder / "out.npz").exists()
