"""Atomic writes: the destination holds either the old content or the new, never a part."""

from __future__ import annotations

import json

import pytest

from cord_ops.atomic import atomic_path, write_json_atomic


def test_failure_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "state.json"
    write_json_atomic(target, {"eta": 1.5})
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_path(target) as tmp:
            tmp.write_text('{"eta": 2.')
            raise RuntimeError("disk full")
    assert json.loads(target.read_text()) == {"eta": 1.5}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_success_replaces_and_creates_folders(tmp_path):
    target = tmp_path / "a" / "b" / "model.bin"
    with atomic_path(target) as tmp:
        assert tmp.parent == target.parent and tmp != target
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new"
    assert oct(target.stat().st_mode & 0o777) == "0o644"


WRITER = """
import os, signal, sys, time
from cord_ops.atomic import atomic_path
with atomic_path(sys.argv[1]) as tmp:
    tmp.write_bytes(b"half")
    print(tmp, flush=True)
    if sys.argv[2] == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
"""


def test_next_write_sweeps_tmp_files_of_killed_writers_but_not_live_ones(tmp_path):
    import os
    import subprocess
    import sys

    # The checkout under test only: this process's sys.path may have picked up folders
    # (e.g. a model-from-code's) whose modules would shadow the standard library.
    env = {**os.environ, "PYTHONPATH": _checkout_root()}
    killed = subprocess.run([sys.executable, "-c", WRITER, str(tmp_path / "out.npz"), "die"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert killed.returncode == -9
    orphan = tmp_path / killed.stdout.strip().rsplit("/", 1)[-1]
    assert orphan.exists()  # kill -9 ran no clean-up
    live = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / "other.npz"), "wait"],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        in_use = tmp_path / live.stdout.readline().strip().rsplit("/", 1)[-1]
        write_json_atomic(tmp_path / "state.json", {"eta": 1.0})
        assert not orphan.exists()
        assert in_use.exists()  # the live writer's file is left alone
    finally:
        live.kill()
        live.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == [in_use.name, "state.json"]


def _checkout_root() -> str:
    from pathlib import Path

    import cord_ops

    return str(Path(cord_ops.__file__).resolve().parents[1])


FOLDER_USER = """
import os, signal, sys, time
from cord_ops.atomic import owned_temporary_directory
with owned_temporary_directory("cord-ops-test-") as folder:
    (folder / "model.onnx").write_bytes(b"half")
    print(folder, flush=True)
    if sys.argv[1] == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
"""


def test_temporary_folders_of_killed_processes_are_swept_by_the_next_user(tmp_path):
    """kill -9 inside owned_temporary_directory leaves the folder; the next use of the
    prefix removes it, and leaves a live process's folder alone."""
    import os
    import subprocess
    import sys

    from cord_ops.atomic import owned_temporary_directory

    env = {**os.environ, "PYTHONPATH": _checkout_root(), "TMPDIR": str(tmp_path)}
    killed = subprocess.run([sys.executable, "-c", FOLDER_USER, "die"], capture_output=True,
                            text=True, env=env, timeout=60)
    assert killed.returncode == -9
    orphan = tmp_path / killed.stdout.strip().rsplit("/", 1)[-1]
    assert (orphan / "model.onnx").exists()  # kill -9 ran no clean-up
    live = subprocess.Popen([sys.executable, "-c", FOLDER_USER, "wait"],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        in_use = tmp_path / live.stdout.readline().strip().rsplit("/", 1)[-1]
        old_tmp = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = str(tmp_path)
        import tempfile

        tempfile.tempdir = None  # re-read TMPDIR
        try:
            with owned_temporary_directory("cord-ops-test-") as mine:
                assert mine.parent == tmp_path
                assert not orphan.exists()
                assert (in_use / "model.onnx").exists()
            assert not mine.exists()
        finally:
            if old_tmp is None:
                os.environ.pop("TMPDIR")
            else:
                os.environ["TMPDIR"] = old_tmp
            tempfile.tempdir = None
    finally:
        live.kill()
        live.wait()
