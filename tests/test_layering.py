"""The shape of the code: dependencies point one way (flows -> onnx_export -> cord_ops, and
inside flows from room to room down the floors of ``FLOORS``), the paper reproduction is a
product of its own that the recalibration product never imports, no package has an import
cycle, and building the ``cord-ops`` parser stays light.

Each import check runs in a fresh interpreter and looks in ``sys.modules``; the cycle check
reads the source, so an import deferred into a function body counts like any other.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("cord_ops", "onnx_export", "flows")

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


def _run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip()


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_does_not_import_upstream_layers(package):
    reached = _run(PROBE.format(package=package, forbidden=FORBIDDEN[package]))
    assert reached == "", f"{package} imports {reached}"


def _modules(package: str) -> dict[str, Path]:
    """Every module of ``package`` by dotted name (a package by its ``__init__``)."""
    root = REPO / package
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


PRODUCT_PROBE = """
import importlib, sys
for name in {modules!r}:
    importlib.import_module(name)
print(",".join(sorted(n for n in sys.modules if n == "flows.reproduce"
                      or n.startswith("flows.reproduce."))))
"""


def test_the_product_never_imports_the_paper_reproduction():
    """Every flows module except the command line and its parser (which offer
    ``reproduce`` and ``bench``), the warm runner's process that runs that command line,
    and the reproduction itself."""
    product = [name for name in _modules("flows")
               if name not in ("flows", "flows.cli.main", "flows.cli.parser",
                               "flows.cli.warm_main")
               and not name.startswith("flows.reproduce")]
    assert {"flows.recalibrate.flow", "flows.monitor.labelled", "flows.store.registry",
            "flows.store.tracking"} <= set(product)
    reached = _run(PRODUCT_PROBE.format(modules=product))
    assert reached == "", f"product modules import {reached}"


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of ``known`` that module ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # ``from a import b`` names module a.b when it is one, else an attribute of a
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a list of modules, or None (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


@pytest.mark.parametrize("package", PACKAGES)
def test_import_graph_has_no_cycle(package):
    modules = {name: path for p in PACKAGES for name, path in _modules(p).items()}
    known = set(modules)
    graph = {name: _imports(name, path, known) for name, path in modules.items()
             if name == package or name.startswith(package + ".")}
    graph = {name: {t for t in targets if t in graph} for name, targets in graph.items()}
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph))}"


HEAVY = ("numpy", "scipy", "sklearn", "pandas", "matplotlib", "mlflow", "prefect", "dask",
         "distributed", "onnx", "onnxruntime")


def test_building_the_command_line_parser_imports_nothing_heavy():
    """``cord-ops --help`` must not pay for numpy, Prefect or MLflow."""
    reached = _run("import sys\nfrom flows.cli.main import build_parser\nbuild_parser()\n"
                   f"print(','.join(sorted({{n.split('.')[0] for n in sys.modules}} & "
                   f"set({HEAVY!r}))))")
    assert reached == "", f"building the parser imports {reached}"


# ---------------------------------------------------------------- the rooms of flows/
#: The floors of the house, lowest first: a module may import its own room and any room on
#: a lower floor, never one on its own floor or above. ``cord_ops`` is the ground,
#: ``onnx_export`` stands on it, ``flows`` on both; inside ``flows`` each subpackage is a
#: room, and a module directly in ``flows/`` is a room of its own name.
FLOORS = (
    ("cord_ops",),
    ("onnx_export",),
    ("flows", "errors", "files"),
    ("redact",),         # credentials out of URIs, before anything prints or stores one
    ("store",),
    ("platform", "shards"),
    ("promotion",),
    # the label-free records are the label-free room's lowest shelf: the served-traffic
    # monitor reads them, and the room's flows stand above recalibration
    ("inputs", "monitor.label_free.records"),
    ("serve",),
    ("pyfunc_model",),   # the logged model's MLflow flavour, with serving's input contract
    ("pyfunc_code",),    # what MLflow executes to load that flavour
    ("recalibrate",),
    ("monitor",),        # labelled monitoring recalibrates as a subflow
    ("schedule",),       # deploys recalibrate and both monitors
    ("reproduce",),
    ("cli",),
)
FLOOR = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}

#: Imports that still run up, each with why it is not cut yet: the test fails on any other
#: (a new one) and on any of these that no longer exists (so the list only shrinks).
KNOWN_WRONG_WAY: dict[tuple[str, str], str] = {}

#: Modules of flows that stay pure: the champion gate's rules are a function of numbers, so
#: reading, testing or reusing them must not need MLflow, Prefect or ONNX (not even in a
#: deferred import); the registry side is flows.promotion.champion.
PURE_MODULES = {
    "flows.promotion.rules": ("mlflow", "prefect", "onnx", "onnxruntime"),
    # the guards the command line asks before the stack loads
    "flows.promotion.guards": ("mlflow", "prefect", "onnx", "onnxruntime"),
}

#: Third-party packages a package (or one module) must not name in any import, deferred
#: ones included (the import-time check above sees only what importing the modules reaches).
FORBIDDEN_ANYWHERE = {
    "cord_ops": ("mlflow", "prefect", "onnx", "onnxruntime"),
    "onnx_export": ("mlflow", "prefect"),
    **PURE_MODULES,
}


def _room(module: str) -> str:
    """The room of a module: its subpackage of flows (or the module's own name directly in
    flows), or the longest dotted room of FLOORS that holds it (a shelf of its own)."""
    parts = module.split(".")
    if parts[0] != "flows" or len(parts) == 1:
        return parts[0]
    inner = parts[1:]
    for end in range(len(inner), 1, -1):
        if ".".join(inner[:end]) in FLOOR:
            return ".".join(inner[:end])
    return inner[0]


def _all_modules() -> dict[str, Path]:
    return {name: path for p in PACKAGES for name, path in _modules(p).items()}


def _wrong_way(modules: dict[str, Path]) -> set[tuple[str, str]]:
    """(importer, imported) for every import of one of ours that does not point down."""
    known = set(modules)
    found = set()
    for name, path in modules.items():
        room = _room(name)
        for target in _imports(name, path, known):
            if _room(target) != room and FLOOR[_room(target)] >= FLOOR[room]:
                found.add((name, target))
    return found


def test_every_room_is_on_a_floor():
    rooms = {_room(name) for name in _all_modules()}
    assert rooms <= set(FLOOR), f"rooms on no floor: {sorted(rooms - set(FLOOR))}"
    assert len(FLOOR) == sum(len(rooms) for rooms in FLOORS), "a room on two floors"


def test_imports_between_rooms_point_down():
    found = _wrong_way(_all_modules())
    new = sorted(found - set(KNOWN_WRONG_WAY))
    assert not new, "imports that run up (or sideways on one floor): " + "; ".join(
        f"{a} -> {b} ({_room(a)} is on floor {FLOOR[_room(a)]}, {_room(b)} on "
        f"{FLOOR[_room(b)]})" for a, b in new)
    gone = sorted(set(KNOWN_WRONG_WAY) - found)
    assert not gone, f"cut, so take them off KNOWN_WRONG_WAY: {gone}"


def test_the_room_check_catches_an_injected_wrong_way_import(tmp_path):
    """The registry importing the command line is reported (and a downward import is not)."""
    modules = _all_modules()
    upward = tmp_path / "injected.py"
    upward.write_text("def f():\n    from flows.cli import main\n"
                      "from flows.store import registry\n")
    modules["flows.store.injected"] = upward
    assert _wrong_way(modules) - set(KNOWN_WRONG_WAY) == {
        ("flows.store.injected", "flows.cli.main")}


def _scope(key: str) -> dict[str, Path]:
    """The modules a key of FORBIDDEN_ANYWHERE covers: a package and everything in it, or
    one module."""
    return {name: path for name, path in _all_modules().items()
            if name == key or name.startswith(key + ".")}


def _forbidden_named(modules: dict[str, Path], forbidden: tuple[str, ...]) -> set[str]:
    """"<module> imports <library>" for every import statement (deferred ones included) of
    ``modules`` that names one of ``forbidden``."""
    named = set()
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                roots = [(node.module or "").split(".")[0]]
            else:
                continue
            named.update(f"{name} imports {root}" for root in roots if root in forbidden)
    return named


@pytest.mark.parametrize("package", sorted(FORBIDDEN_ANYWHERE))
def test_package_names_no_forbidden_library_anywhere(package):
    modules = _scope(package)
    assert modules, f"{package}: no such package or module (renamed? update the table)"
    named = _forbidden_named(modules, FORBIDDEN_ANYWHERE[package])
    assert not named, sorted(named)


def test_the_forbidden_library_check_catches_an_injected_import(tmp_path):
    """MLflow, Prefect and ONNX named anywhere in the gate's rules are reported, deferred
    into a function or not; numpy and our own modules are not (the import-time check below
    sees what those reach)."""
    rules = tmp_path / "rules.py"
    rules.write_text("import numpy as np\n"
                     "from flows.errors import CordOpsError\n"
                     "from onnx import helper\n"
                     "def score(uri):\n"
                     "    import mlflow.tracking\n"
                     "    from prefect import flow\n")
    assert _forbidden_named({"flows.promotion.rules": rules},
                            PURE_MODULES["flows.promotion.rules"]) == {
        "flows.promotion.rules imports onnx", "flows.promotion.rules imports mlflow",
        "flows.promotion.rules imports prefect"}


PURE_PROBE = """
import importlib, sys
sys.path[:0] = {extra!r}
importlib.import_module({module!r})
print(",".join(sorted({{n.split(".")[0] for n in sys.modules}} & set({forbidden!r}))))
"""


@pytest.mark.parametrize("module", sorted(PURE_MODULES))
def test_a_pure_module_reaches_no_forbidden_library_when_imported(module):
    """What the module imports of ours must stay pure too (the source check above sees only
    the module's own import statements)."""
    reached = _run(PURE_PROBE.format(extra=[], module=module, forbidden=PURE_MODULES[module]))
    assert reached == "", f"importing {module} imports {reached}"


def test_the_pure_import_check_catches_a_module_that_reaches_prefect(tmp_path):
    """A module importing the recalibration flow reaches Prefect and ONNX through it, with
    no import of either in its own source."""
    (tmp_path / "injected_pure.py").write_text("from flows.recalibrate import flow\n")
    reached = _run(PURE_PROBE.format(extra=[str(tmp_path)], module="injected_pure",
                                     forbidden=PURE_MODULES["flows.promotion.rules"]))
    assert {"onnx", "prefect"} <= set(reached.split(","))


# ---------------------------------------------------------------- private names
#: Private names still reached from outside where they live, each with why: the test fails
#: on any other and on any of these that is gone.
KNOWN_PRIVATE: dict[tuple[str, str], str] = {}


def _private_uses(modules: dict[str, Path]) -> set[tuple[str, str]]:
    """(importer, what) for ``from m import _name`` with m another module, and for an import
    of a private module (``pkg._mod``) from outside ``pkg``."""
    known = set(modules)
    found = set()
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                if target.split(".")[0] not in PACKAGES:
                    continue
                parts = target.split(".")
                for depth, part in enumerate(parts):
                    if not part.startswith("_") or part.startswith("__"):
                        continue
                    owner = ".".join(parts[:depth])  # the module or package it belongs to
                    is_module = ".".join(parts[:depth + 1]) in known
                    inside = name == owner or name.startswith(owner + ".") if is_module \
                        else name == owner
                    if not inside:
                        found.add((name, ".".join(parts[:depth + 1])))
                    break
    return found


def test_no_private_name_is_imported_from_outside_its_module():
    found = _private_uses(_all_modules())
    new = sorted(found - set(KNOWN_PRIVATE))
    assert not new, f"private names imported from outside their module: {new}"
    gone = sorted(set(KNOWN_PRIVATE) - found)
    assert not gone, f"no longer used, so take them off KNOWN_PRIVATE: {gone}"


def test_the_private_name_check_catches_an_injected_use(tmp_path):
    modules = _all_modules()
    user = tmp_path / "injected.py"
    user.write_text("from cord_ops.cord_kernels import _reconstruct\n"
                    "from cord_ops.calibrators import _base\n")
    modules["flows.injected"] = user
    assert _private_uses(modules) - set(KNOWN_PRIVATE) == {
        ("flows.injected", "cord_ops.cord_kernels._reconstruct"),
        ("flows.injected", "cord_ops.calibrators._base")}


# ---------------------------------------------------------------- private attributes
#: ``x._name`` reached from outside the module that defines ``_name``, each with why it
#: stays: the test fails on any other and on any of these that is gone. Keys are (module,
#: the attribute as written).
KNOWN_PRIVATE_ATTRIBUTES = {
    ("flows.platform.warm", "atexit._run_exitfuncs"):
        "the warm runner's child runs the interpreter's exit handlers (Prefect sends the "
        "logs and events it still queues) before os._exit; the standard library has no "
        "public call for that",
}

#: Names with a leading underscore that are public API where they are defined: a named
#: tuple's methods (the underscore keeps them apart from field names) and ``os._exit``.
PUBLIC_UNDERSCORE_METHODS = ("_asdict", "_field_defaults", "_fields", "_make", "_replace")
PUBLIC_UNDERSCORE_FUNCTIONS = (("os", "_exit"),)


def _defined_names(tree: ast.AST) -> set[str]:
    """Names a module defines itself: functions, classes, methods, names it assigns and
    attributes it sets. Imported names do not count: they are defined elsewhere."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.attr)
    return names


def _own_receiver(value: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: the object's own class hierarchy."""
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
            and value.func.id == "super")


def _private_attributes(modules: dict[str, Path]) -> set[tuple[str, str]]:
    """(module, ``x._name``) for every read of an attribute with one leading underscore
    whose name the module does not define, on a receiver other than self, cls or super()."""
    found = set()
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        defined = _defined_names(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
                continue
            attr = node.attr
            if not attr.startswith("_") or attr.startswith("__") or attr in defined:
                continue
            if _own_receiver(node.value) or attr in PUBLIC_UNDERSCORE_METHODS:
                continue
            if (isinstance(node.value, ast.Name)
                    and (node.value.id, attr) in PUBLIC_UNDERSCORE_FUNCTIONS):
                continue
            found.add((name, ast.unparse(node)))
    return found


def test_no_private_attribute_is_used_from_outside_its_module():
    found = _private_attributes(_all_modules())
    new = sorted(found - set(KNOWN_PRIVATE_ATTRIBUTES))
    assert not new, f"private attributes used outside the module that defines them: {new}"
    gone = sorted(set(KNOWN_PRIVATE_ATTRIBUTES) - found)
    assert not gone, f"no longer used, so take them off KNOWN_PRIVATE_ATTRIBUTES: {gone}"


def test_the_private_attribute_check_catches_an_injected_use(tmp_path):
    """A calibrator's private method called from another module is reported, and so is a
    private function reached through a module even when its name is also imported; the
    module's own private names, self/cls/super(), a named tuple's _replace and os._exit are
    not."""
    modules = _all_modules()
    user = tmp_path / "injected.py"
    user.write_text(
        "import os\n"
        "from cord_ops.calibrators import _base as base\n"
        "from cord_ops.calibrators._base import _float_list\n"
        "class Mine:\n"
        "    _limit = 3\n"
        "    def _own(self):\n"
        "        return super()._probe() + self._hidden + type(self)._limit\n"
        "def use(calibrator, other, row, scores):\n"
        "    calibrator._logits(scores)\n"
        "    base._float_list(scores)\n"
        "    other._own()\n"
        "    other.inner._own()\n"
        "    row._replace(n=1)\n"
        "    _float_list.__name__\n"
        "    os._exit(0)\n")
    modules["flows.injected"] = user
    assert _private_attributes(modules) - set(KNOWN_PRIVATE_ATTRIBUTES) == {
        ("flows.injected", "calibrator._logits"), ("flows.injected", "base._float_list")}
