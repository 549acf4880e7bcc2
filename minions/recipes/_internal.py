"""What the other layers of minions take from `minions.recipes` and users do not: the one
module of this package they may import besides `minions.recipes` itself.

Not public: any of it may change in any release. Who takes what, and why, is the table
"What a package takes from a neighbour's private module" of docs/architecture.md, which
``tests/test_architecture.py`` holds to the code. Each name loads its module on first use,
as a direct import of it would (pydantic and PyYAML load when the YAML side is used).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minions._lazy import lazy_names

_NAMES: dict[str, str] = {
    # The checks of a recipe, whose graph `StepGraph` walks.
    "Analysis": "minions.recipes._validation",
    # Parts of the YAML format the run store and the service read off a `RecipeSpec`.
    "CatchUp": "minions.recipes._schema",
    "HttpSpec": "minions.recipes._schema",
    "Overlap": "minions.recipes._schema",
    "ScheduleSpec": "minions.recipes._schema",
    # A recipe file's text, read within its bounds.
    "read_recipe_text": "minions.recipes._loader",
    # Recipes as a plan writes them (its own header and keys around the format's).
    "recipe_to_data": "minions.recipes._dump",
    "to_yaml_text": "minions.recipes._dump",
    # The tools a ``module:name`` reference names (a recipe's ``tools:``, `minions plan`).
    "import_tools": "minions.recipes._build",
    # A folder of recipes by id, and the files beside a recipe.
    "INLINE_SUFFIX": "minions.recipes._folder",
    "RecipeFolder": "minions.recipes._folder",
    "folder_files": "minions.recipes._folder",
    "folder_recipes": "minions.recipes._folder",
    "recording_beside": "minions.recipes._folder",
}

if TYPE_CHECKING:
    from minions.recipes._build import import_tools as import_tools
    from minions.recipes._dump import recipe_to_data as recipe_to_data
    from minions.recipes._dump import to_yaml_text as to_yaml_text
    from minions.recipes._folder import INLINE_SUFFIX as INLINE_SUFFIX
    from minions.recipes._folder import RecipeFolder as RecipeFolder
    from minions.recipes._folder import folder_files as folder_files
    from minions.recipes._folder import folder_recipes as folder_recipes
    from minions.recipes._folder import recording_beside as recording_beside
    from minions.recipes._loader import read_recipe_text as read_recipe_text
    from minions.recipes._schema import CatchUp as CatchUp
    from minions.recipes._schema import HttpSpec as HttpSpec
    from minions.recipes._schema import Overlap as Overlap
    from minions.recipes._schema import ScheduleSpec as ScheduleSpec
    from minions.recipes._validation import Analysis as Analysis


__getattr__, __dir__ = lazy_names(__name__, _NAMES, globals())
