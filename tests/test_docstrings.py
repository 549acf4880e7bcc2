"""Every public class, function, method and property says what it is: a docstring of its own
(a dataclass's generated signature is not one), or the one of the method it overrides."""

from __future__ import annotations

import importlib
import inspect

import pytest

PUBLIC = [
    "minions",
    "minions.events",
    "minions.errors",
    "minions.models",
    "minions.tools",
    "minions.recipes",
    "minions.testing",
]


def undocumented(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    missing = []
    for name in module.__all__:
        value = getattr(module, name)
        if inspect.isfunction(value) and not value.__doc__:
            missing.append(name)
        if not inspect.isclass(value):
            continue
        doc = value.__doc__ or ""
        if not doc or doc.startswith(f"{value.__name__}("):
            missing.append(name)
        for attribute, member in vars(value).items():
            if attribute.startswith("_"):
                continue
            found = member.__func__ if isinstance(member, staticmethod | classmethod) else member
            found = found.fget if isinstance(found, property) else found
            if not inspect.isfunction(found) or found.__doc__:
                continue
            overridden = (getattr(base, attribute, None) for base in value.__mro__[1:])
            if not any(getattr(o, "__doc__", None) for o in overridden):
                missing.append(f"{name}.{attribute}")
    return missing


@pytest.mark.parametrize("module_name", PUBLIC)
def test_every_public_name_has_a_docstring(module_name: str) -> None:
    assert undocumented(module_name) == []
