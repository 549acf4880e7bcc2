"""Recipes: an agent as data, in code or YAML.

`AgentRecipe` holds the steps, transitions and run defaults; `recipe_problems` lists what is
wrong with one; `RecipeStep` runs a whole recipe as one step of another. `load_recipe` /
`parse_recipe` read the YAML format (see docs/recipes.md), `dump_recipe` writes it, and
`InputSpec` declares a recipe's inputs; `parse_spec` checks YAML text against the format
without building it, into a `RecipeSpec` (the format as a pydantic model) and where each key
is (`Located`). Those load pydantic and PyYAML on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minions._lazy import lazy_names
from minions.recipes._recipe import AgentRecipe
from minions.recipes._subrecipe import RecipeStep
from minions.recipes._validation import recipe_problems

if TYPE_CHECKING:
    from minions._yaml import Located
    from minions.recipes._build import RecipeFile, load_recipe, load_recipe_file, parse_recipe
    from minions.recipes._dump import dump_recipe
    from minions.recipes._loader import parse_spec
    from minions.recipes._schema import InputSpec, RecipeSpec

# The YAML side needs pydantic and PyYAML: it loads on first use, so `import minions` does not.
_YAML: dict[str, str] = {
    "RecipeFile": "minions.recipes._build",
    "load_recipe": "minions.recipes._build",
    "load_recipe_file": "minions.recipes._build",
    "parse_recipe": "minions.recipes._build",
    "dump_recipe": "minions.recipes._dump",
    "InputSpec": "minions.recipes._schema",
    "Located": "minions._yaml",
    "RecipeSpec": "minions.recipes._schema",
    "parse_spec": "minions.recipes._loader",
}


__getattr__, __dir__ = lazy_names(__name__, _YAML, globals())


__all__ = [
    "AgentRecipe",
    "InputSpec",
    "Located",
    "RecipeFile",
    "RecipeSpec",
    "RecipeStep",
    "dump_recipe",
    "load_recipe",
    "load_recipe_file",
    "parse_recipe",
    "parse_spec",
    "recipe_problems",
]
