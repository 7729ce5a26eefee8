"""Attributes of a package loaded on first use, so importing it stays light.

``import ddl.torch`` must not pay for the elastic machinery a job may never use, and
``import ddl`` must not pay for every subsystem; each package declares what it loads late
and gets its module ``__getattr__`` from here (PEP 562).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def submodules(package: str, names: tuple[str, ...]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``package.<name>`` for each of ``names`` when first read."""

    def __getattr__(name: str) -> Any:
        if name in names:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


def attributes(package: str, where: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that takes each name of ``where`` from the module it maps to
    when first read, and keeps it in ``namespace`` (the package's globals) from then on."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
