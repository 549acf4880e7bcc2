"""Importing the Python module a file a person wrote names: a recipe's ``tools:``
(``tools`` for the ``tools.py`` beside it, or an installed ``package.module``) and an eval
dataset's ``python:`` checks.

A module beside the file is loaded from there under a name of its own, so that two recipes'
``tools.py`` never clash, and once per process: a second recipe or dataset beside the same
file gets the same module.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType

from minions.errors import MinionsError

__all__: list[str] = []

_IMPORTING = threading.RLock()
"""Recipes load in threads (the run store, the REST service): a tools module is imported
whole by one of them before another sees it in `sys.modules`."""


def import_module(name: str, base: Path) -> ModuleType:
    """The module `name`: the file beside `base` (``base/name.py``, dots as folders) when there
    is one, else the installed module.

    Raises:
        MinionsError: it cannot be found, or importing it failed (its error named).
    """
    with _IMPORTING:
        return _import_module_once(name, base)


def _import_module_once(name: str, base: Path) -> ModuleType:
    local = base.joinpath(*name.split(".")).with_suffix(".py")
    if local.is_file():
        digest = hashlib.sha1(str(local).encode()).hexdigest()[:8]
        unique = f"_minions_recipe_{digest}_{name.replace('.', '_')}"
        loaded = sys.modules.get(unique)
        if loaded is not None:
            return loaded
        spec = importlib.util.spec_from_file_location(unique, local)
        if spec is None or spec.loader is None:
            raise MinionsError(f"cannot load {str(local)!r}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[unique] = module
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as exc:
            del sys.modules[unique]
            raise MinionsError(f"importing {str(local)!r} failed: {_failure(exc)}") from None
        return module
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise MinionsError(f"cannot import tools from {name!r}: {exc}") from None
    except (Exception, SystemExit) as exc:
        raise MinionsError(f"importing {name!r} failed: {_failure(exc)}") from None


def _failure(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r})"
    return f"{type(exc).__name__}: {exc}"
