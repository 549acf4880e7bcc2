"""Recipes loaded in several threads at once (the run store and the REST service submit in
threads): a tools module slow to import is imported once, whole, before any of them uses it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from minions.recipes import load_recipe_file

SLOW_TOOLS = """\
import time

from minions import tool

time.sleep(0.3)  # a module that takes a while to import (heavy dependencies)


@tool
def shout(text: str) -> str:
    \"\"\"Shout.\"\"\"
    return text.upper()
"""


def test_a_tools_module_is_imported_whole_before_any_thread_uses_it(tmp_path: Path) -> None:
    (tmp_path / "slowtools.py").write_text(SLOW_TOOLS)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "id: loud\ntools: [slowtools]\nsteps: [{id: a, tool: shout, params: {text: hi}}]\n"
    )
    with ThreadPoolExecutor(8) as pool:
        loaded = list(pool.map(lambda _: load_recipe_file(recipe), range(8)))
    assert all(r.recipe.id == "loud" for r in loaded)
