"""Tools of the activity-monitor example: a small fitness account kept in a JSON file.

The account file is ``$ACTIVITY_MONITOR_DATA`` when set (changes persist there). Otherwise each
process works on a fresh copy of ``data/account.json`` in a temporary folder, so the demo
starts from the same data every time. The data carries its own clock (``"clock"``) so the
example is reproducible; delete that key to use the real time.
"""

from __future__ import annotations

import atexit
import datetime as dt
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal

from minions import ToolError, tool

PRISTINE = Path(__file__).parent / "data" / "account.json"
Visibility = Literal["everyone", "followers", "only_me"]
_copy: Path | None = None


def account_file() -> Path:
    global _copy
    configured = os.environ.get("ACTIVITY_MONITOR_DATA")
    if configured:
        return Path(configured)
    if _copy is None:
        folder = Path(tempfile.mkdtemp(prefix="minions-activity-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)  # leave nothing behind
        _copy = folder / "account.json"
        shutil.copy(PRISTINE, _copy)
    return _copy


def _load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(account_file().read_text())
    return data


def _save(data: dict[str, Any]) -> None:
    account_file().write_text(json.dumps(data, indent=1))


def _now(data: dict[str, Any]) -> dt.datetime:
    clock = data.get("clock")
    return dt.datetime.fromisoformat(clock) if clock else dt.datetime.now(dt.UTC)


def _find(data: dict[str, Any], activity_id: int) -> dict[str, Any]:
    for activity in data["activities"]:
        if activity["id"] == activity_id:
            return activity  # type: ignore[no-any-return]
    known = ", ".join(str(a["id"]) for a in data["activities"])
    raise ToolError(f"No activity with id {activity_id}. Known ids: {known}.")


@tool(run_in_thread=False)
def list_activities(
    hours: int = 24, owner: Literal["me", "friends"] = "me"
) -> list[dict[str, Any]]:
    """List recent activities, newest first.

    Args:
        hours: how many hours back to look.
        owner: "me" for my own activities, "friends" for my friends' activities.
    """
    data = _load()
    now = _now(data)
    found = []
    for activity in data["activities"]:
        mine = activity["owner"] == data["athlete"]
        if mine != (owner == "me"):
            continue
        age = (now - dt.datetime.fromisoformat(activity["start_time"])).total_seconds() / 3600
        if age <= hours:
            found.append(
                {
                    "id": activity["id"],
                    "name": activity["name"],
                    "type": activity["type"],
                    "distance_km": activity["distance_km"],
                    "hours_ago": round(age, 1),
                    "visibility": activity["visibility"],
                    **(
                        {}
                        if mine
                        else {"owner": activity["owner"], "kudoed": activity["kudos_from_me"]}
                    ),
                }
            )
    return sorted(found, key=lambda a: a["hours_ago"])


@tool(run_in_thread=False)
def update_activity(id: int, visibility: Visibility) -> dict[str, Any]:
    """Change who can see one of my activities.

    Args:
        id: the activity's id.
        visibility: "everyone", "followers" or "only_me".
    """
    data = _load()
    activity = _find(data, id)
    if activity["owner"] != data["athlete"]:
        raise ToolError(f"Activity {id} belongs to {activity['owner']}; only mine can be updated.")
    old = activity["visibility"]
    activity["visibility"] = visibility
    _save(data)
    return {"id": id, "name": activity["name"], "from": old, "to": visibility}


@tool(run_in_thread=False)
def give_kudos(id: int) -> dict[str, Any]:
    """Give kudos to a friend's activity.

    Args:
        id: the activity's id.
    """
    data = _load()
    activity = _find(data, id)
    if activity["owner"] == data["athlete"]:
        raise ToolError(f"Activity {id} is mine; kudos are for friends' activities.")
    activity["kudos_from_me"] = True
    _save(data)
    return {"id": id, "name": activity["name"], "owner": activity["owner"]}


@tool(run_in_thread=False)
def load_state() -> dict[str, Any]:
    """The monitor's saved state: when it last ran and how many runs it has made."""
    state = _load()["state"]
    return {"last_check": state["last_check"], "runs": len(state["history"])}


@tool(run_in_thread=False)
def save_state(updated: list[Any], kudos: list[Any]) -> dict[str, Any]:
    """Record this run: the time, the activities updated and the kudos given.

    Args:
        updated: the results of the visibility updates.
        kudos: the results of the kudos given.
    """
    data = _load()
    now = _now(data).isoformat()
    changed = [u for u in updated if u]
    given = [k for k in kudos if k]
    data["state"]["last_check"] = now
    data["state"]["history"].append({"at": now, "updated": len(changed), "kudos": len(given)})
    _save(data)
    return {"last_check": now, "updated": len(changed), "kudos": len(given)}
