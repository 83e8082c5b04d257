"""What a wheel install gets: every module of the three packages, the console
script, and a version. The wheel is built here, from a copy of the sources, by pip the way
``pip install .`` builds it (an isolated build of pyproject.toml's backend)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import REPO_ROOT

PACKAGES = ("cord_ops", "onnx_export", "flows")


def test_the_wheel_holds_every_module_and_the_console_script(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    for package in PACKAGES:
        shutil.copytree(REPO_ROOT / package, source / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                           str(tmp_path / "dist"), str(source)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("cord_ops-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
    expected = {path.relative_to(REPO_ROOT).as_posix()
                for package in PACKAGES for path in (REPO_ROOT / package).rglob("*.py")
                if "__pycache__" not in path.parts}
    assert "flows/monitor/label_free/records.py" in expected
    assert sorted(expected - names) == []
    assert "cord-ops = flows.cli.main:main" in scripts
    # Nothing from outside the packages (tests, benchmarks, docs) rides along.
    assert not [n for n in names if n.split("/")[0] in ("tests", "benchmarks", "docs")]


def test_version_is_the_installed_distributions():
    from importlib import metadata

    script = Path(sys.executable).with_name("cord-ops")
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"cord-ops {metadata.version('cord-ops')}"
