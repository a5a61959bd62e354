"""Names a module exports without importing their homes until first used, so that importing it
(and the CLI, which answers most commands through the daemon, without any model) stays cheap."""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing's, without importing it (see ragidx.app)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any


def lazy_names(module: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) that imports each name of ``homes`` from its home module
    on first use; the module lists the same names under ``TYPE_CHECKING`` for type checkers."""

    def find(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return getattr(importlib.import_module(homes[name]), name)

    return find
