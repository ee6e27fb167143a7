"""The package's shape (docs/architecture.rst): stages as subpackages whose imports point one way, no import cycle
(imports inside functions counted), no module a newcomer cannot read in a sitting, one errors module, a short
``DPIV2SLS.fit``, and 0.1's public names still importable (moved modules through deprecated aliases).

The import graph is read from the source with :mod:`ast`, not from ``sys.modules``: an import hidden in a function
is an edge like any other, and importing ``dpivreg.a.b`` also runs ``dpivreg/a/__init__.py`` (an edge to ``dpivreg.a``
too). Left out of those implicit edges: the root package (every submodule import runs it, in any package) and a
module's own packages (Python initialises them before the module, whatever it imports).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import sys
import warnings
from collections import defaultdict
from pathlib import Path

import pytest

import dpivreg
from dpivreg import errors
from dpivreg.model import DPIV2SLS

PACKAGE = Path(dpivreg.__file__).parent
MAX_MODULE_LINES = 1000
MAX_FIT_LINES = 80

ARCHITECTURE = Path(__file__).parents[1] / "docs" / "architecture.rst"


def documented_layers() -> dict[str, int]:
    """module -> layer, read from the "Layers" table of docs/architecture.rst (the page is the truth; this test
    holds the code to it). A cell's ``sub/`` names the subpackage of the ``.py`` files after it."""
    table = ARCHITECTURE.read_text(encoding="utf-8").split("\nLayers\n", 1)[1].split("\nThe privacy boundary\n", 1)[0]
    layers = {}
    for number, cell in re.findall(r"\* - (\d+)\n\s+- (.+?)\n\s+- ", table, re.DOTALL):
        package = "dpivreg"
        for token in re.findall(r"``([^`]+)``", cell):
            if token.endswith("/"):
                package = "dpivreg." + token.rstrip("/")
                layers[package] = int(number)
            elif token.endswith(".py"):
                stem = token[:-3]
                layers[package if stem == "__init__" else f"{package}.{stem}"] = int(number)
    return layers


def module_files(root: Path) -> dict[str, Path]:
    """Every module of the package under ``root``, by dotted name (a package by its ``__init__.py``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports anywhere in its source, with the packages those imports run."""
    modules = module_files(root)
    top = root.name
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            for target in targets:
                parts = target.split(".")
                for k in range(2, len(parts) + 1):  # the module and the subpackages its import runs
                    candidate = ".".join(parts[:k])
                    if candidate in modules and candidate != name and not name.startswith(candidate + "."):
                        graph[name].add(candidate)  # (a module's own packages are initialised before it, always)
                if target == top and name != top:
                    graph[name].add(top)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_layers_table_names_every_module():
    """Every module of the package has its row in docs/architecture.rst's layers table, and the table names no
    module that does not exist."""
    assert set(documented_layers()) == set(module_files(PACKAGE))


def test_the_cycle_finder_sees_an_import_hidden_in_a_function(tmp_path):
    """The checker itself: a two-module cycle through a function-level import, and one through a subpackage's
    ``__init__``, are found; the acyclic version is not flagged."""
    pkg = tmp_path / "toy"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from toy import b\n")
    (pkg / "b.py").write_text("def f():\n    from toy.a import g  # hidden\n")
    (pkg / "sub" / "__init__.py").write_text("from toy.sub import c\n")
    (pkg / "sub" / "c.py").write_text("")
    (pkg / "d.py").write_text("import toy.sub.c\n")
    assert cycles(import_graph(pkg)) == [["toy.a", "toy.b"]]
    (pkg / "sub" / "c.py").write_text("from toy import d\n")
    assert sorted(cycles(import_graph(pkg))) == [["toy.a", "toy.b"], ["toy.d", "toy.sub", "toy.sub.c"]]
    (pkg / "b.py").write_text("")
    (pkg / "sub" / "c.py").write_text("")
    assert cycles(import_graph(pkg)) == []


def test_no_import_cycle():
    assert cycles(import_graph(PACKAGE)) == []


def test_imports_point_down_the_pipeline():
    """Each import goes to the module's own layer or one below (errors < privacy < compute < data < estimation <
    inference < reporting < the model < planning): the stages never reach up."""
    layers = documented_layers()
    upward = [f"{a} -> {b}" for a, targets in import_graph(PACKAGE).items() for b in sorted(targets)
              if layers[b] > layers[a]]
    assert upward == []


def test_stages_are_subpackages():
    stages = {"privacy", "compute", "data", "estimation", "inference", "reporting", "planning"}
    assert {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()} == stages


def test_no_module_over_a_thousand_lines():
    sizes = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in module_files(PACKAGE).items()}
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_no_exception_class_is_defined_outside_errors():
    """From the source: no class anywhere (nested ones included) derives from a Warning, Error or Exception."""
    found = []
    for name, path in module_files(PACKAGE).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and name != "dpivreg.errors":
                bases = [ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases]
                if any(base.endswith(("Warning", "Error", "Exception")) for base in bases):
                    found.append(f"{name}.{node.name}")
    assert found == []


def test_every_warning_and_error_class_is_defined_in_errors_and_exported():
    for name in module_files(PACKAGE):
        if name != "dpivreg.__main__":
            importlib.import_module(name)
    defined = {
        (cls.__module__, cls.__qualname__)
        for name in module_files(PACKAGE) if name != "dpivreg.__main__"
        for cls in vars(importlib.import_module(name)).values()
        if isinstance(cls, type) and issubclass(cls, BaseException) and cls.__module__.startswith("dpivreg")
    }
    assert {module for module, _ in defined} == {"dpivreg.errors"}
    names = {qualname for _, qualname in defined}
    assert {"PrivacyLeakWarning", "ConvergenceWarning", "DivergenceError", "InferenceUnavailableError"} <= names
    assert all(getattr(dpivreg, n) is getattr(errors, n) for n in names)
    assert names <= set(dpivreg.__all__)


def test_fit_is_a_short_sequence_of_named_stages():
    """``DPIV2SLS.fit`` (decorator, signature and body; its documentation lives beside the options it documents,
    :mod:`dpivreg.fit_options`) fits on a screen."""
    source = inspect.getsource(DPIV2SLS.fit)
    assert len(source.splitlines()) <= MAX_FIT_LINES
    assert "Parameters\n----------" in inspect.getdoc(DPIV2SLS.fit)


def _api_0_1() -> dict[str, list[str]]:
    return json.loads((Path(__file__).parent / "data" / "api_0_1.json").read_text())["modules"]


@pytest.mark.parametrize("module", sorted(_api_0_1()))
def test_every_public_name_of_0_1_is_still_importable(module):
    """Each name of 0.1's flat modules (tests/data/api_0_1.json says where the list came from), from the same
    module path: unchanged modules directly, moved ones through their alias."""
    name = "dpivreg" if module == "__init__" else f"dpivreg.{module}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        imported = importlib.import_module(name)
        missing = [n for n in _api_0_1()[module] if not hasattr(imported, n)]
    assert missing == []


def test_moved_modules_warn_and_are_the_new_modules():
    """``import dpivreg.design`` and friends: a DeprecationWarning naming the new path; a module that moved whole
    is the new module object itself (so ``isinstance`` and monkeypatching keep working)."""
    from dpivreg._aliases import MOVED

    for old, new in MOVED.items():
        name = f"dpivreg.{old}"
        importlib.invalidate_caches()
        saved = sys.modules.pop(name, None)
        try:
            first = new if isinstance(new, str) else new[0]
            with pytest.warns(DeprecationWarning, match=rf"{name} is a deprecated alias of {first}"):
                alias = importlib.import_module(name)
        finally:
            sys.modules.pop(name, None)
            if saved is not None:
                sys.modules[name] = saved
        if isinstance(new, str):
            assert alias is importlib.import_module(new)
        else:  # each name from the first part that has it
            parts = [importlib.import_module(part) for part in new]
            for part in parts:
                for attr in getattr(part, "__all__", ()):
                    owner = next(p for p in parts if hasattr(p, attr))
                    assert getattr(alias, attr) is getattr(owner, attr)


def test_old_module_paths_as_package_attributes_and_assignments_through_them():
    """0.1 reached ``dpivreg.theory`` after ``import dpivreg`` and let users set e.g.
    ``dpivreg.engine.PROGRESS_SECONDS`` (the fit's docstring said so): both still work, with the deprecation warning;
    a split alias sets the name in the part that holds it."""
    from dpivreg import progress

    saved_module, saved_attribute = sys.modules.pop("dpivreg.theory", None), vars(dpivreg).pop("theory", None)
    try:  # as in a fresh interpreter: not imported yet, so the package's __getattr__ is asked
        with pytest.warns(DeprecationWarning, match="dpivreg.theory is a deprecated alias of"):
            assert dpivreg.theory.plan is dpivreg.plan
    finally:
        if saved_module is not None:
            sys.modules["dpivreg.theory"] = saved_module
            dpivreg.theory = saved_attribute
    with pytest.raises(AttributeError):
        dpivreg.no_such_module  # noqa: B018
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import dpivreg.engine as old_engine
    saved = progress.PROGRESS_SECONDS
    try:
        old_engine.PROGRESS_SECONDS = 0.0
        assert progress.PROGRESS_SECONDS == 0.0
    finally:
        progress.PROGRESS_SECONDS = saved


def test_the_0_1_resolve_units_still_takes_a_dask_design():
    dd = pytest.importorskip("dask.dataframe")
    import numpy as np
    import pandas as pd

    from dpivreg.data.unit_ids import resolve_units

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"y": rng.normal(size=40), "x": rng.normal(size=40), "z": rng.normal(size=40),
                          "hh": np.repeat(np.arange(10), 4)})
    ddf = dd.from_pandas(frame, npartitions=2)
    model = DPIV2SLS.from_formula("y ~ 1 + [x ~ z]", ddf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        units = resolve_units(model.design, privacy_unit="hh", clusters=None, max_rows_per_unit=4, data=ddf, seed=1)
    assert units.facts.n_units == 10


def test_the_simulation_names_of_0_1_inference_warn():
    from dpivreg.estimation import simulation

    with pytest.warns(DeprecationWarning, match="dpivreg.estimation.simulation.simulate_fit"):
        from dpivreg.inference import simulate_fit
    assert simulate_fit is simulation.simulate_fit


def _newcomer_table() -> list[tuple[str, str, str]]:
    """(question, file, name) rows of docs/architecture.rst's "A newcomer's questions" table."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    table = text.split("A newcomer's questions", 1)[1].split("\nDeprecated flat module paths", 1)[0]
    rows = re.findall(r"\* - (.+?)\n\s+- ``(.+?)``\n\s+- ``(.+?)``", table)
    return [row for row in rows if row[0] != "question"]


def test_the_architecture_page_answers_each_question_with_a_file_that_holds_the_answer():
    rows = _newcomer_table()
    assert len(rows) >= 10
    root = Path(__file__).parents[1]
    for question, file, name in rows:
        source = (root / file).read_text(encoding="utf-8")
        defined = re.search(rf"^\s*(def|class) {re.escape(name)}\b|^{re.escape(name)}\s*=", source, re.MULTILINE)
        assert defined, f"{question}: {file} does not define {name}"
