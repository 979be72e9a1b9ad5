"""How a planted fault goes onto upstream code: `_patch` wraps one class or module
attribute, keeping the upstream original for `faults.uninstall`."""
from __future__ import annotations

import importlib
from typing import Callable, Optional

_ORIGINALS: dict = {}        # (module, class, attr) -> the upstream function, for uninstall


def _patch(module: str, cls: Optional[str], attr: str, make: Callable) -> None:
    """Replace module.cls.attr (cls None: the module's own attr) by make(what is there
    now). Two faults on one attribute stack, each wrapping the other; `uninstall` puts
    back the upstream original, kept from the first. Each fault is installed once
    (`install`)."""
    mod = importlib.import_module(module)
    target = mod if cls is None else getattr(mod, cls)
    current = vars(target)[attr]
    _ORIGINALS.setdefault((module, cls, attr), current)
    wrapper = make(current)
    wrapper.__kvcheck_fault__ = True
    setattr(target, attr, wrapper)
