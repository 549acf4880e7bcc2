"""Recipes: an agent as data, in code or YAML.

`AgentRecipe` holds the steps, transitions and run defaults; `recipe_problems` lists what is
wrong with one; `RecipeStep` runs a whole recipe as one step of another. `load_recipe` /
`parse_recipe` read the YAML format (see docs/recipes.md), `dump_recipe` writes it, and
`InputSpec` declares a recipe's inputs; those load pydantic and PyYAML on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minions._lazy import lazy_names
from minions.recipes._recipe import AgentRecipe
from minions.recipes._subrecipe import RecipeStep
from minions.recipes._validation import recipe_problems

if TYPE_CHECKING:
    from minions.recipes._build import RecipeFile, load_recipe, load_recipe_file, parse_recipe
    from minions.recipes._dump import dump_recipe
    from minions.recipes._schema import InputSpec

# The YAML side needs pydantic and PyYAML: it loads on first use, so `import minions` does not.
_YAML: dict[str, str] = {
    "RecipeFile": "minions.recipes._build",
    "load_recipe": "minions.recipes._build",
    "load_recipe_file": "minions.recipes._build",
    "parse_recipe": "minions.recipes._build",
    "dump_recipe": "minions.recipes._dump",
    "InputSpec": "minions.recipes._schema",
}


__getattr__, __dir__ = lazy_names(__name__, _YAML, globals())


__all__ = [
    "AgentRecipe",
    "InputSpec",
    "RecipeFile",
    "RecipeStep",
    "dump_recipe",
    "load_recipe",
    "load_recipe_file",
    "parse_recipe",
    "recipe_problems",
]
