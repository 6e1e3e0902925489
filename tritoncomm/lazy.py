"""Names a package exports, imported from their modules at first use (PEP 562), so that importing the
package costs only what its caller touches.

A package declares ``__getattr__, __dir__ = lazy.exports(__name__, {".collectives": ["AllReduce", ...]})``:
each module (relative to the package) and the names it defines that the package exports; a name that
is the last part of its module's path (``{".launch": ["launch"]}``) is that module itself. The first access imports the
module and binds the name on the package, so later accesses are plain attribute reads."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["exports"]


def exports(package: str, modules: Mapping[str, Iterable[str]]) -> tuple[Callable[[str], Any],
                                                                       Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, which exports the names of ``modules`` (module ->
    the names it defines)."""
    table = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        where = table.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(where, package)
        value = module if where.rsplit(".", 1)[-1] == name else getattr(module, name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(table))

    return __getattr__, __dir__
