"""Recipes: an agent as data, in code or YAML.

`AgentRecipe` holds the steps, transitions and run defaults; `load_recipe` / `parse_recipe` read
the YAML format (see docs/recipes.md) and `dump_recipe` writes it; `RecipeStep` runs a whole
recipe as one step of another; `InputSpec` declares a recipe's inputs.
"""

from minions.recipes._build import RecipeFile, load_recipe, load_recipe_file, parse_recipe
from minions.recipes._dump import dump_recipe
from minions.recipes._recipe import AgentRecipe
from minions.recipes._schema import InputSpec
from minions.recipes._subrecipe import RecipeStep
from minions.recipes._validation import recipe_problems

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
