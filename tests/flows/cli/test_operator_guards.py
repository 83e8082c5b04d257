"""The operator surface on a real store, as a new operator meets it: a first version the gate
refused for harm leaves no champion, and every message then names the refusal and the
next right step; ``promote``, ``rollback`` and a rollout guard harm the same way (refused
without ``--allow-harm``, accepted with it, the override in the history) and say when a
version is worse than the champion it replaces; a mistake is answered before MLflow,
Prefect or onnx is imported.

One store for the module, built by two real recalibrations through the command line
(in-process, on the session's Prefect server): model ``persp`` v1 is temperature scaling
fitted on logits three times too confident and evaluated on logits a third as confident,
so it is far worse than the uncalibrated classifier there (the gate's harm); v2 is the
plain digits classifier, promoted. Every test starts from a pristine copy of the store at
the same path (MLflow keeps artifact paths absolute), before or after v2.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cord_ops import data
from flows.cli.main import main

pytestmark = pytest.mark.slow

MODEL = "persp"
STACK = {"mlflow", "prefect", "onnx", "onnxruntime", "skl2onnx", "sqlalchemy"}


@pytest.fixture(scope="module")
def built(tmp_path_factory, store_at, digits, prefect_harness):
    """(work folder, {"harmful": snapshot, "promoted": snapshot}, the harmful run's output)."""
    root = tmp_path_factory.mktemp("persp")
    work = root / "work"
    uri = store_at(work / "mlruns" / "mlflow.db")
    over = data.save_npz(root / "over.npz", digits.scores * 3.0, digits.labels, "logits")
    under = data.save_npz(root / "under.npz", digits.scores * 0.3, digits.labels, "logits")
    good = data.save_npz(root / "digits.npz", digits.scores, digits.labels, "logits")
    snapshots, printed = {}, {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        patch.chdir(work)
        for label, argv in (("harmful", ["--data", str(over), "--eval-data", str(under),
                                         "--calibrator", "ts"]),
                            ("promoted", ["--data", str(good)])):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = main(["recalibrate", "--model-name", MODEL, *argv])
            assert code == 0, out.getvalue()[-3000:]
            printed[label] = out.getvalue()
            snapshots[label] = root / label
            shutil.copytree(work / "mlruns", snapshots[label])
    return work, uri, snapshots, printed


@pytest.fixture
def at(built, monkeypatch):
    """``at("harmful" | "promoted")``: the store as it was after that run, in place."""
    work, uri, snapshots, _ = built

    def restore(label: str) -> str:
        snapshot, store = snapshots[label], work / "mlruns"
        for entry in store.iterdir():
            if entry.name != "mlflow.db":
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        for entry in snapshot.iterdir():
            if entry.name == "mlflow.db":
                # Rewritten in place: this process's MLflow keeps its engine on this file.
                shutil.copyfile(entry, store / entry.name)
            elif entry.is_dir():
                shutil.copytree(entry, store / entry.name)
            else:
                shutil.copy(entry, store / entry.name)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        monkeypatch.chdir(work)
        return uri
    return restore


def cli(*argv: str, cwd: Path, importtime: bool = False) -> tuple[int, str, str, set[str]]:
    """Run ``cord-ops`` in a fresh interpreter (``-X importtime`` lists what it imported);
    (exit status, stdout, stderr without the import lines, top-level modules imported)."""
    command = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m",
               "flows.cli.main", *argv]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PREFECT_API_URL": ""})
    imported = {row.rsplit("|", 1)[-1].strip().split(".")[0]
                for row in done.stderr.splitlines() if row.startswith("import time:")}
    err = "\n".join(row for row in done.stderr.splitlines() if not row.startswith("import time:"))
    return done.returncode, done.stdout, err, imported


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """The same command in this process (what passes needs the stack anyway; a refusal is
    run by :func:`cli`, which sees the imports)."""
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def last_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), err[-3000:]
    assert [line for line in lines if line.startswith("error:")] == [lines[-1]]
    return lines[-1]


def history(uri: str) -> list[dict]:
    from mlflow import MlflowClient

    from flows.promotion.champion import read_history

    return read_history(MlflowClient(uri), MODEL)


# ---------------------------------------------------------------- no champion
def test_a_refused_first_version_says_why_and_how_to_promote_it(built):
    _, _, _, printed = built
    out = printed["harmful"]
    assert "v1 rejected" in out and "does harm" in out, out
    (step,) = [line for line in out.splitlines() if "no @champion yet" in line]
    assert "v1 was not promoted (" in step and "does harm" in step
    assert (f"`cord-ops promote --model-name {MODEL} --version 1 --reason TEXT --allow-harm`"
            in step)
    assert f"models:/{MODEL}@champion" not in out  # no predict of a champion that is not there


def test_predict_and_monitor_without_a_champion_name_the_refusal_and_the_next_step(
        at, tmp_path, digits):
    at("harmful")
    work = Path.cwd()
    batch = data.save_npz(tmp_path / "batch.npz", digits.scores, digits.labels, "logits")
    for argv in (["predict", "--model", f"models:/{MODEL}@champion", "--input", str(batch),
                  "--output", str(tmp_path / "out.npz")],
                 ["monitor", "--data", str(batch), "--model-name", MODEL]):
        code, _, err, imported = cli(*argv, cwd=work, importtime=True)
        line = last_error(err)
        assert code == 1
        assert f"model '{MODEL}' has no @champion" in line
        assert "v1 was not promoted (" in line and "does harm" in line
        assert f"cord-ops promote --model-name {MODEL} --version 1 --reason TEXT" in line
        assert "run `cord-ops recalibrate" not in line
        assert not imported & STACK, imported & STACK
    assert not (tmp_path / "out.npz").exists()


def test_a_misspelt_alias_names_the_aliases_that_exist(at, tmp_path, digits):
    at("promoted")
    batch = data.save_npz(tmp_path / "batch.npz", digits.scores, digits.labels, "logits")
    code, _, err, _ = cli("predict", "--model", f"models:/{MODEL}@champoin", "--input",
                          str(batch), "--output", str(tmp_path / "out.npz"), cwd=Path.cwd())
    line = last_error(err)
    assert code == 1 and "no @champoin" in line
    assert "its aliases: @champion (v2)" in line and "recalibrate" not in line


# ---------------------------------------------------------------- harm, guarded alike
def test_promote_of_a_harmful_version_needs_allow_harm_and_says_it_is_worse(at, capsys):
    uri = at("promoted")
    code, out, err, imported = cli("promote", "--model-name", MODEL, "--version", "1",
                                   "--reason", "try it", cwd=Path.cwd(), importtime=True)
    line = last_error(err)
    assert code == 1 and line.startswith("error: cannot promote v1: v1 is worse than the "
                                         "uncalibrated model")
    assert "--allow-harm" in line and "Error" not in line
    assert not imported & STACK, imported & STACK  # told from the store's cheap reads

    code, out, err = run(capsys, "promote", "--model-name", MODEL, "--version", "1",
                         "--reason", "try it", "--allow-harm")
    assert code == 0, err[-3000:]
    assert f"{MODEL}@champion: v2 -> v1" in out
    assert "override: --allow-harm" in out
    (warning,) = [row for row in out.splitlines() if row.startswith("warning:")]
    assert "v1 is worse than v2, the champion it replaces: NLL" in warning
    row = history(uri)[-1]
    assert (row["version"], row["from"], row["how"]) == ("1", "2", "promote")
    assert row["overrides"] == ["allow-harm"] and "worse than v2" in row["warning"]


def test_a_second_rollback_to_a_harmful_version_needs_allow_harm(at, capsys):
    uri = at("promoted")
    assert main(["promote", "--model-name", MODEL, "--version", "1", "--reason", "try",
                 "--allow-harm"]) == 0
    assert main(["rollback", "--model-name", MODEL, "--reason", "undo"]) == 0  # v1 -> v2
    code, _, err, imported = cli("rollback", "--model-name", MODEL, cwd=Path.cwd(),
                                 importtime=True)
    line = last_error(err)
    assert code == 1 and "cannot roll back to v1: v1 is worse than the uncalibrated" in line
    assert not imported & STACK, imported & STACK
    code, out, err = run(capsys, "rollback", "--model-name", MODEL, "--allow-harm")
    assert code == 0, err[-3000:]
    assert f"{MODEL}@champion: v2 -> v1" in out and "override: --allow-harm" in out
    assert [(r["how"], r["version"], r.get("overrides")) for r in history(uri)[-3:]] == [
        ("promote", "1", ["allow-harm"]), ("rollback", "2", None),
        ("rollback", "1", ["allow-harm"])]


def test_a_rollout_of_a_version_worse_than_its_champion_says_so_at_start_and_end(at, capsys):
    from mlflow import MlflowClient

    from flows.promotion import rollout_record
    uri = at("promoted")
    code, _, err, imported = cli("rollout", "start", "--model-name", MODEL, "--version", "1",
                                 "--reason", "canary", cwd=Path.cwd(), importtime=True)
    assert code == 1 and "cannot roll out v1: v1 is worse than the uncalibrated" in \
        last_error(err)
    assert not imported & STACK, imported & STACK
    code, out, err = run(capsys, "rollout", "start", "--model-name", MODEL, "--version", "1",
                         "--reason", "canary", "--allow-harm")
    assert code == 0, err[-3000:]
    (warning,) = [row for row in out.splitlines() if row.startswith("warning:")]
    assert "v1 is worse than v2, the champion it replaces" in warning
    client = MlflowClient(uri)
    record = rollout_record.read(client, MODEL)
    # The end, as a server carries it out after the last step passed.
    ended = rollout_record.transition(client, uri, MODEL, record["id"], record["revision"],
                                      "promote", "last step within budget", "test")
    assert ended["state"] == rollout_record.PROMOTED
    assert "warning: v1 is worse than v2, the champion it replaces" in ended["outcome"]
    row = history(uri)[-1]
    assert (row["how"], row["version"], row["overrides"]) == ("rollout", "1", ["allow-harm"])
    assert "worse than v2" in row["warning"]


# ---------------------------------------------------------------- a second for a mistake
@pytest.mark.parametrize("argv, expected", [
    (["promote", "--version", "7", "--reason", "typo"],
     "--version 7: model 'persp' has no version 7 in"),
    (["promote", "--version", "2", "--reason", "again"],
     "v2 already holds @champion of 'persp': nothing to promote"),
    (["rollout", "start", "--version", "1"], "rollout start: --reason required"),
    (["rollout", "start", "--version", "2", "--reason", "again"],
     "v2 already holds @champion of 'persp': nothing to roll out"),
    (["rollout", "start", "--version", "1", "--reason", "x", "--steps", "50,10"],
     "--steps: expected strictly increasing percentages"),
])
def test_mistakes_are_answered_before_the_stack_is_imported(at, argv, expected):
    at("promoted")
    code, out, err, imported = cli(*argv[:2] if argv[0] == "rollout" else argv[:1],
                                   "--model-name", MODEL,
                                   *(argv[2:] if argv[0] == "rollout" else argv[1:]),
                                   cwd=Path.cwd(), importtime=True)
    line = last_error(err)
    assert code == 1 and expected in line, line
    assert "Error" not in line
    assert not imported & STACK, imported & STACK



# ---------------------------------------------------------------- one truth, in a terminal
def test_status_fits_the_terminal_and_json_keeps_every_word(at, capsys, monkeypatch):
    at("promoted")
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run(capsys, "status", "--model-name", MODEL)
    assert code == 0, err[-3000:]
    lines = out.splitlines()
    assert max(map(len, lines)) <= 80, max(lines, key=len)
    assert lines[-1] == "(lines cut at 80 characters; `--json` prints every word)"
    (harmful,) = [line for line in lines if line.startswith("v1 ")]
    assert harmful.split()[3] == "rejected!"  # worse than the uncalibrated model
    assert "! worse than the uncalibrated model (the gate's do-no-harm rule)" in lines
    code, out, _ = run(capsys, "status", "--model-name", MODEL, "--json")
    report = json.loads(out)
    assert report["champion"] == "2"
    (first,) = [row for row in report["rows"] if row["version"] == "1"]
    assert first["harms"] is True and first["decision"] == "rejected!"
    assert "does harm: NLL" in first["reason"] and len(first["reason"]) > 80
