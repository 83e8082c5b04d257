"""Dependencies point one way: flows -> onnx_export -> cord_ops.

Each package is imported, with all its modules, in a fresh interpreter, and the modules
it may not reach are looked for in sys.modules.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

FORBIDDEN = {
    "cord_ops": ("mlflow", "prefect", "onnx", "onnxruntime", "flows", "onnx_export"),
    "onnx_export": ("mlflow", "prefect", "flows"),
}

PROBE = """
import importlib, pkgutil, sys
package = importlib.import_module({package!r})
for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
    importlib.import_module(info.name)
reached = sorted({{name.split(".")[0] for name in sys.modules}} & set({forbidden!r}))
print(",".join(reached))
"""


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_does_not_import_upstream_layers(package):
    code = PROBE.format(package=package, forbidden=FORBIDDEN[package])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "", f"{package} imports {result.stdout.strip()}"
