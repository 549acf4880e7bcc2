"""Make the recording beside an example's recipe, offline, with the example's stand-in model.

    python examples/record.py examples/activity_monitor

The stand-in (``stand_in.py``) computes each reply from the prompt; see its docstring. With a
real model, record with the CLI instead:
``minions run examples/activity_monitor/recipe.yaml --model ollama:llama3.2:3b --record
examples/activity_monitor/recipe.recording.json``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

from minions import AgentExecutor, AgentResult, load_recipe
from minions.models import Recording, RecordingModel
from minions.testing import FunctionModel


def record(folder: Path, *, save: bool = True) -> tuple[AgentResult, Recording]:
    """Run the example with its stand-in model; save the recording beside the recipe."""
    spec = importlib.util.spec_from_file_location(
        f"_stand_in_{folder.name}", folder / "stand_in.py"
    )
    assert spec is not None
    assert spec.loader is not None
    stand_in = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stand_in)
    prepare = getattr(stand_in, "prepare", None)
    if prepare is not None:
        prepare()  # e.g. start from pristine data
    recipe = load_recipe(folder / "recipe.yaml")
    recording = Recording(meta={"model": "stand-in (examples/record.py)", "recipe": recipe.id})
    executor = AgentExecutor(
        model=FunctionModel(stand_in.reply, name="stand-in"),
        model_wrapper=lambda model: RecordingModel(model, recording),
    )
    result = asyncio.run(executor.execute(recipe))
    if save:
        recording.save(folder / "recipe.recording.json")
    return result, recording


if __name__ == "__main__":
    for name in sys.argv[1:]:
        result, recording = record(Path(name))
        print(f"{name}: {result.status.value}, {len(recording)} replies recorded")
        if not result.ok:
            print(f"  {result.error}")
            sys.exit(1)
