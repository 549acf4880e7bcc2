"""A stand-in for a language model, used to make this example's recording offline.

No model runs on the machine that builds minions, so the recording beside the recipe was
made by this function (``python examples/record.py examples/activity_monitor``): it applies
the recipe's rules to the data in the prompt, the way a small model is asked to. Record a
real run with ``minions run recipe.yaml --model ollama:llama3.2:3b --record recipe.recording.json``.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from minions import Prompt


def prepare() -> None:
    """Start from the pristine account: a fresh copy, as a first run in a new process has."""
    folder = Path(tempfile.mkdtemp(prefix="minions-activity-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # leave nothing behind
    shutil.copy(Path(__file__).parent / "data" / "account.json", folder / "account.json")
    os.environ["ACTIVITY_MONITOR_DATA"] = str(folder / "account.json")


def _data(prompt: Prompt) -> Any:
    found = re.search(r"The data:\n```(json)?\n(.*?)\n```", prompt.messages[-1].content, re.S)
    if found is None:
        return None
    return json.loads(found.group(2)) if found.group(1) else found.group(2)


def _results(prompt: Prompt) -> dict[str, Any]:
    """The outputs of earlier steps, which the prompt lists as ``[step id]`` then JSON."""
    text = prompt.messages[-1].content
    found = {}
    for step_id, body in re.findall(
        r"^\[(\w+)\]\n(.*?)(?=^\[\w+\]\n|^Task:|\Z)", text, re.S | re.M
    ):
        try:
            found[step_id] = json.loads(body)
        except ValueError:
            found[step_id] = body.strip()
    return found


def _visibility(activity: dict[str, Any]) -> str | None:
    name = activity["name"].lower()
    if "commute" in name:
        return "only_me"
    if activity["type"] == "walk" and activity["distance_km"] < 2:
        return "only_me"
    if "race" in name:
        return "everyone"
    return None


def reply(prompt: Prompt) -> str:
    if prompt.step_id == "decide":
        changes = []
        for activity in _data(prompt) or []:
            wanted = _visibility(activity)
            if wanted is not None and wanted != activity["visibility"]:
                changes.append({"id": activity["id"], "visibility": wanted})
        return json.dumps(
            {
                "activities_to_update": changes,
                "reasoning": "Commutes and short walks become private; races are public.",
            }
        )
    if prompt.step_id == "summary":
        results = _results(prompt)
        updated = [(u["name"], u["to"]) for u in results.get("update") or [] if u]
        kudos = len([k for k in results.get("kudos") or [] if k])
        changed = ", ".join(f"{name} is now {to}" for name, to in updated) or "nothing changed"
        return f"Visibility updated: {changed}. You gave {kudos} kudos to friends."
    raise ValueError(f"the stand-in has no reply for step {prompt.step_id!r}")
