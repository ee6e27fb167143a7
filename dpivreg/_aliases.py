"""The deprecated flat module paths: ``import dpivreg.design`` gives :mod:`dpivreg.data.design` itself (the same
module object, so classes and functions are the same objects) with a ``DeprecationWarning`` that names the module to
import instead. A flat path whose names live in several modules (``dpivreg.design``, ``dpivreg.theory``,
``dpivreg.units``, …, or in :mod:`dpivreg.errors` for their warnings) has an alias that looks names up in each of
them in turn. ``dpivreg.privacy``, ``dpivreg.inference`` and ``dpivreg.planning`` are packages that export their
modules' public names themselves (the simulation names in ``dpivreg.inference`` with a ``DeprecationWarning``: the
simulation is in :mod:`dpivreg.estimation.simulation`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

#: Deprecated flat module (under ``dpivreg.``) -> the module, or the modules, that hold its names.
MOVED = {
    "validation": "dpivreg._validation",
    "mechanisms": "dpivreg.privacy.mechanisms",
    "units": ("dpivreg.privacy.units", "dpivreg.data.unit_ids"),
    "kernels": ("dpivreg.compute.kernels", "dpivreg.compute.codegen", "dpivreg.compute.simulation_steps"),
    "backends": "dpivreg.compute.backends",
    "cross_products": "dpivreg.data.cross_products",
    "boundary": ("dpivreg.data.boundary", "dpivreg.errors"),
    "bounds": "dpivreg.data.bounds",
    "formula_replay": "dpivreg.data.formula_replay",
    "derived_columns": "dpivreg.data.derived_columns",
    "design": ("dpivreg.data.design", "dpivreg.data.arrays", "dpivreg.data.builders", "dpivreg.data.checks",
               "dpivreg.data.columns", "dpivreg.data.formula", "dpivreg.errors"),
    "_dask": ("dpivreg.data.dask_design", "dpivreg.data.dask_builders"),
    "preprocess": "dpivreg.estimation.working_scale",
    "moments": "dpivreg.estimation.moments",
    "clipping": "dpivreg.estimation.clipping",
    "engine": ("dpivreg.estimation.engine", "dpivreg.progress", "dpivreg.errors"),
    "tuning": "dpivreg.estimation.tuning",
    "selection": "dpivreg.estimation.selection",
    "covariance": "dpivreg.inference.covariance",
    "diagnostics": "dpivreg.inference.diagnostics",
    "anderson_rubin": "dpivreg.inference.anderson_rubin",
    "results": "dpivreg.reporting.results",
    "tables": "dpivreg.reporting.tables",
    "release": "dpivreg.reporting.release",
    "comparison": "dpivreg.reporting.comparison",
    "theory": ("dpivreg.estimation.theory", "dpivreg.planning.theorem_plan"),
}


class _SplitModule(types.ModuleType):
    """The alias of a module split in several: attributes are looked up in each part in turn."""

    def __init__(self, name: str, parts: list[types.ModuleType]) -> None:
        super().__init__(name, f"Alias of {', '.join(part.__name__ for part in parts)} (deprecated).")
        self._parts = parts
        self.__all__ = [name for part in parts for name in getattr(part, "__all__", ())]

    def __getattr__(self, attr: str):
        for part in self._parts:
            if hasattr(part, attr):
                return getattr(part, attr)
        raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")

    def __setattr__(self, attr: str, value) -> None:
        """A name one of the parts holds is set there (``dpivreg.engine.PROGRESS_SECONDS = 0`` reaches
        :mod:`dpivreg.progress`); anything else on the alias itself."""
        if not attr.startswith("__") and attr != "_parts":
            for part in self._parts:
                if hasattr(part, attr):
                    setattr(part, attr, value)
                    return
        super().__setattr__(attr, value)

    def __dir__(self) -> list[str]:
        return sorted({name for part in self._parts for name in dir(part)})


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``dpivreg.<flat module>`` and loads it as the module that holds its names (see :data:`MOVED`)."""

    def __init__(self) -> None:
        self._original_specs: dict[int, object] = {}

    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.partition(".")
        if package != "dpivreg" or name not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        target = MOVED[spec.name.partition(".")[2]]
        targets = (target,) if isinstance(target, str) else target
        new = " and ".join(targets)
        warnings.warn(f"{spec.name} is a deprecated alias of {new}: import {new} instead.", DeprecationWarning,
                      stacklevel=2)
        if len(targets) > 1:
            return _SplitModule(spec.name, [importlib.import_module(part) for part in targets])
        module = importlib.import_module(target)
        self._original_specs[id(module)] = module.__spec__  # the import system sets the alias's spec: restored below
        return module

    def exec_module(self, module):
        module.__spec__ = self._original_specs.pop(id(module), module.__spec__)


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())


def moved_attribute(name: str):
    """``dpivreg.<flat module>`` as an attribute of the package (``dpivreg.theory`` after ``import dpivreg``):
    imported through the finder, so it warns as ``import dpivreg.theory`` does."""
    if name not in MOVED:
        raise AttributeError(f"module 'dpivreg' has no attribute {name!r}")
    return importlib.import_module(f"dpivreg.{name}")
