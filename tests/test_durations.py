"""One duration grammar for every option and file (the retention of runs, `runs prune
--older-than`, a step's `cache.ttl`, the limits file, a schedule's `every`), with one bound: a
duration longer than ten years is a clear error naming the value and the limit (before, `runs
prune --older-than 999999999d` raised OverflowError, and a very long `--every` was stored and
then failed as a traceback, or a 500 on the API)."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
from runs_helpers import TOOLS, chain
from service_helpers import TOKEN, app_in_thread, auth, write_recipes
from typer.testing import CliRunner

from minions._duration import LONGEST, TooLongError, duration_seconds
from minions._step.cache import CachePolicy
from minions.cli._app import app
from minions.errors import ConfigError, RecipeError
from minions.models import Limits
from minions.recipes import parse_recipe
from minions.runs import RunStore
from minions.service import ServiceConfig, create_app

TOO_LONG = "999999999d"


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (90, 90.0),
        (1.5, 1.5),
        ("90", 90.0),
        ("90s", 90.0),
        (" 5 m ", 300.0),
        ("1h30m", 5400.0),
        ("2w", 1209600.0),
        ("3650d", LONGEST),
    ],
)
def test_a_duration_is_seconds_or_numbers_with_units(value: float | str, seconds: float) -> None:
    assert duration_seconds(value) == seconds


@pytest.mark.parametrize("value", ["", "soon", "0s", "0", -1, 0, True, "1e3s", "5x", "h", "1.s"])
def test_what_is_not_a_duration_is_named(value: object) -> None:
    with pytest.raises(ValueError, match=r"is not a duration: give a positive duration") as raised:
        duration_seconds(value)  # type: ignore[arg-type]
    assert repr(value) in str(raised.value)


@pytest.mark.parametrize("value", [TOO_LONG, "3651d", 1e20, float("inf"), "9" * 400 + "d"])
def test_a_duration_past_ten_years_is_refused_naming_the_limit(value: float | str) -> None:
    with pytest.raises(TooLongError, match=r"longer than 3650d \(ten years\)"):
        duration_seconds(value)


def test_a_step_caches_for_weeks_and_never_past_the_limit() -> None:
    made = parse_recipe("id: z\nsteps:\n  - {id: a, goal: g, cache: {ttl: 2w}}\n")
    assert made.steps[0].cache == CachePolicy(ttl=1209600.0)
    with pytest.raises(RecipeError, match=r"cache ttl: '999999999d' is longer than 3650d"):
        parse_recipe(f"id: z\nsteps:\n  - {{id: a, goal: g, cache: {{ttl: {TOO_LONG}}}}}\n")


def test_the_limits_file_takes_the_same_durations(tmp_path: Path) -> None:
    file = tmp_path / "limits.yaml"
    file.write_text("capability_expiry: 2w\n")
    assert Limits.load(file).capability_expiry == 1209600.0
    file.write_text(f"capability_expiry: {TOO_LONG}\n")
    with pytest.raises(ConfigError, match=r"capability_expiry.*longer than 3650d"):
        Limits.load(file)


def test_every_cli_option_refuses_a_duration_past_the_limit(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / "tools.py").write_text(TOOLS)
    recipe = folder / "tick.yaml"
    recipe.write_text(chain(steps=["one"]))
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, [*args, "--database-url", url])
        return result.exit_code, result.output

    code, out = run("schedules", "add", str(recipe), "--every", "2w", "-i", "tag=t")
    assert code == 0, out
    assert "every 1209600s" in out
    code, out = run(
        "schedules", "add", str(recipe), "--every", TOO_LONG, "-i", "tag=t", "--name", "far"
    )
    assert code == 2, out
    assert "every: '999999999d' is longer than 3650d" in out
    code, out = run("schedules", "list")
    assert "far" not in out  # nothing stored
    code, out = run("runs", "prune", "--older-than", TOO_LONG)
    assert code == 2, out
    assert "--older-than: '999999999d' is longer than 3650d" in out
    code, out = run("runs", "prune", "--older-than", "2w")
    assert code == 0, out
    for command in (["worker"], ["serve"]):
        code, out = run(*command, "--retention", TOO_LONG)
        assert code == 2, out
        assert "--retention: '999999999d' is longer than 3650d" in out


async def test_the_store_refuses_a_duration_past_the_limit(tmp_path: Path) -> None:
    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / "tools.py").write_text(TOOLS)
    recipe = folder / "tick.yaml"
    recipe.write_text(chain(steps=["one"]))
    async with RunStore(f"sqlite:///{tmp_path / 'store.db'}", create=True) as store:
        with pytest.raises(RecipeError, match="longer than 3650d"):
            await store.add_schedule(recipe, every=10**12, inputs={"tag": "t"})
        with pytest.raises(TooLongError):
            await store.prune(1e12)
        assert (await store.prune("2w")).runs == 0
        assert (await store.prune(0)).runs == 0  # seconds may be none: every finished run
        with pytest.raises(ValueError, match="-1 is not a duration"):
            await store.prune(-1)
        with pytest.raises(ValueError, match="'0s' is not a duration"):
            await store.prune("0s")
        assert await store.schedules() == []


def test_the_api_answers_a_schedule_past_the_limit_with_a_400(tmp_path: Path) -> None:
    config = ServiceConfig(
        token=TOKEN,
        database_url=f"sqlite:///{tmp_path / 'api' / 'minions.db'}",
        recipes=write_recipes(tmp_path / "recipes"),
    )
    with (
        app_in_thread(create_app(config)) as base,
        httpx2.Client(base_url=base, headers=auth(), timeout=60) as client,
    ):
        body = {"recipe": "ledger", "inputs": {"tag": "api"}}
        refused = client.post("/schedules", json={**body, "every": TOO_LONG})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["type"] == "invalid_recipe"
        assert "longer than 3650d" in refused.text
        assert client.get("/schedules").json() == []
        weekly = client.post("/schedules", json={**body, "every": "2w"})
        assert weekly.status_code == 201, weekly.text
        assert weekly.json()["every"] == 1209600
