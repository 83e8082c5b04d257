"""The lower bounds in pyproject.toml exclude every release of a direct dependency that a
published advisory with a fix covers (docs/security.md, item 8).

ADVISORIES is the table the bounds come from: per package, the first fixed release of
each advisory in the PyPA advisory database (aliases as published) that has one. A new
advisory is a new row here and a raised bound in pyproject.toml.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

ADVISORIES = {
    "pyarrow": [("CVE-2023-47248", "14.0.1"),   # arbitrary code from Parquet/IPC files
                ("CVE-2026-25087", "23.0.1")],  # use after free reading Arrow IPC files
    "mlflow": [("MLflow's host and CORS validation (DNS rebinding)", "3.5.0"),
               ("CVE-2026-2652", "3.10.0"),     # FastAPI routes bypass basic-auth
               ("CVE-2026-10803", "3.10.1"),
               ("CVE-2026-33866", "3.11.0rc0"),  # AJAX endpoint authorization bypass
               ("CVE-2026-4137", "3.11.0")],    # world-writable model download folders
    "prefect": [("CVE-2024-8183", "3.0.3"),      # CORS misconfiguration
                ("CVE-2026-7723", "3.6.14"),     # unauthenticated event injection
                ("CVE-2026-7722", "3.6.22"),     # auth bypass via health-check exemption
                ("CVE-2026-7724", "3.6.28.dev2")],  # SSRF via DNS rebinding
    "dask": [("CVE-2026-23528", "2026.1.0")],   # dashboard XSS (distributed, via the extra)
    "onnx": [("CVE-2024-5187", "1.16.2"),
             ("CVE-2026-27489", "1.21.0"),      # external data path traversal via symlink
             ("CVE-2026-44512", "1.22.0")],
    "filelock": [("CVE-2025-68146", "3.20.1"), ("CVE-2026-22701", "3.20.3")],
    "starlette": [("CVE-2025-62727", "0.49.1"), ("CVE-2026-48710", "1.0.1"),
                  ("CVE-2026-54283", "1.3.1")],
    "orjson": [("CVE-2024-27454", "3.9.15"), ("CVE-2025-67221", "3.11.5")],
    "scikit-learn": [("CVE-2024-5206", "1.5.0")],
    "pyyaml": [("CVE-2020-14343", "5.4")],
    "scipy": [("CVE-2023-25399", "1.10.0")],
    "psutil": [("CVE-2019-18874", "5.6.6")],
    "uvicorn": [("CVE-2020-7695", "0.11.7")],
}


def _lower_bounds() -> dict[str, Version]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    bounds = {}
    for text in project["dependencies"]:
        requirement = Requirement(text)
        floors = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
        bounds[requirement.name.lower()] = max(floors) if floors else None
    return bounds


@pytest.mark.parametrize("package", sorted(ADVISORIES))
def test_lower_bound_excludes_every_fixed_advisory(package):
    bound = _lower_bounds().get(package)
    assert bound is not None, f"{package}: no >= lower bound in pyproject.toml"
    for advisory, fixed in ADVISORIES[package]:
        assert bound >= Version(fixed), (f"{package}>={bound} admits releases before "
                                         f"{fixed}, which fixed {advisory}")
