"""The audit log and what the service tells people: a scripted day through a real `minions
serve` whose audit log names the actor, address and target of every change (submit, approve,
reject, cancel, resume, rerun, schedule add/pause/resume/remove, prune, key add/revoke);
`GET /me` and its waiting count; a rejection as its own outcome; the model's note never shown
to a person; `GET /audit`'s filters, pages and bad inputs; `minions audit`; an entry written
in the transaction of its change (SQLite and Postgres); the audit's own retention."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx2
import pytest
import sqlalchemy as sa
from service_helpers import TOKEN, app_in_thread, auth, server, write_recipes
from typer.testing import CliRunner

from minions.cli import app as cli
from minions.cli._common import cli_actor
from minions.runs import Actor, RunStore
from minions.service import ServiceConfig, create_app

NOTE = "Do not make it again"


def _until(client: httpx2.Client, run_id: str, status: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while True:
        body: dict[str, Any] = client.get(f"/runs/{run_id}").json()
        if body["status"] == status:
            return body
        assert body["status"] not in ("completed", "failed", "cancelled"), body
        assert time.monotonic() < deadline, body
        time.sleep(0.05)


def _waiting_call(client: httpx2.Client, run_id: str) -> str:
    call: str = _until(client, run_id, "waiting")["approvals"][-1]["call_id"]
    return call


@pytest.mark.slow
def test_a_scripted_day_names_the_actor_of_every_change(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    recipes = write_recipes(tmp_path / "recipes")
    runner = CliRunner()
    with server(tmp_path, url, "--recipes", str(recipes), LEDGER=str(tmp_path / "l.txt"),
                FLAKY_OK=str(tmp_path / "ok")) as process:  # fmt: skip
        token = httpx2.Client(base_url=process.base, headers=auth(), timeout=60)
        made = {}
        for name, role in (("olga", "operator"), ("alice", "approver"), ("vic", "viewer")):
            answer = token.post("/keys", json={"name": name, "role": role})
            assert answer.status_code == 201, answer.text
            made[name] = answer.json()["key"]
        olga, alice, vic = (
            httpx2.Client(base_url=process.base, headers=auth(made[n]), timeout=60)
            for n in ("olga", "alice", "vic")
        )
        # Approved by alice; who she is and what waits for her, before and after.
        first = olga.post("/runs", json={"recipe": "release"}).json()["run_id"]
        call = _waiting_call(olga, first)
        me = alice.get("/me").json()
        assert me == {
            "name": "alice",
            "role": "approver",
            "projects": ["default"],
            "may": ["read", "approve"],
            "waiting": 1,
        }
        assert vic.get("/me").json()["waiting"] == 0  # a viewer decides nothing
        assert token.get("/me").json()["name"] == "token"
        assert alice.post(f"/runs/{first}/approvals/{quote(call)}", json={"approve": True}).status_code == 200  # fmt: skip
        _until(olga, first, "completed")
        assert alice.get("/me").json()["waiting"] == 0
        # Rejected by alice: a rejected outcome, and the model's note shown to nobody.
        second = olga.post("/runs", json={"recipe": "release"}).json()["run_id"]
        call = _waiting_call(olga, second)
        alice.post(
            f"/runs/{second}/approvals/{quote(call)}", json={"approve": False, "reason": "friday"}
        )
        rejected = _until(olga, second, "failed")
        assert (rejected["outcome"], rejected["rejected_by"]) == ("rejected", "alice")
        listed = {r["run_id"]: r for r in olga.get("/runs").json()["runs"]}
        assert (listed[second]["outcome"], listed[first]["outcome"]) == ("rejected", "completed")
        assert "A person rejected this call to 'shout': friday." in rejected["error"]
        for path in ("", "/events", "/steps", "/steps/say"):
            shown = olga.get(f"/runs/{second}{path}")
            assert shown.status_code == 200, shown.text
            assert NOTE not in shown.text, path
        store = ["--database-url", url]
        for command in (["runs", "show", second], ["runs", "step", second, "say"],
                        ["runs", "events", second], ["runs", "list"]):  # fmt: skip
            shown_cli = runner.invoke(cli, [*command, *store])
            assert shown_cli.exit_code == 0, shown_cli.output
            assert NOTE not in shown_cli.output, command
        assert "rejected" in runner.invoke(cli, ["runs", "list", *store]).output
        # Cancelled by the token, resumed by olga, cancelled again by olga.
        third = olga.post("/runs", json={"recipe": "release"}).json()["run_id"]
        _waiting_call(olga, third)
        assert token.post(f"/runs/{third}/cancel").status_code == 200
        _until(olga, third, "cancelled")
        assert olga.post(f"/runs/{third}/resume").status_code == 200
        _waiting_call(olga, third)
        assert olga.post(f"/runs/{third}/cancel").status_code == 200
        _until(olga, third, "cancelled")
        # Rerun by olga from the step after the approval.
        rerun = olga.post(f"/runs/{first}/rerun", json={"from_step": "after"})
        assert rerun.status_code == 201, rerun.text
        fourth = rerun.json()["run_id"]
        _until(olga, fourth, "completed")
        # A schedule's life.
        added = olga.post("/schedules", json={"recipe": "ledger", "every": "1h", "inputs": {"tag": "s"}})  # fmt: skip
        assert added.status_code == 201, added.text
        assert olga.post("/schedules/ledger/pause").status_code == 200
        assert token.post("/schedules/ledger/resume").status_code == 200
        assert olga.delete("/schedules/ledger").status_code == 204
        # Pruned on the store by a person at a terminal; vic's key revoked over the API.
        # (`--older-than` takes a second at least: the cancelled run gets that old first.)
        ended = olga.get(f"/runs/{third}").json()["finished_at"]
        time.sleep(max(0.0, ended + 1.05 - time.time()))
        pruned = runner.invoke(cli, ["runs", "prune", "--older-than", "1s", "--status", "cancelled", *store])  # fmt: skip
        assert pruned.exit_code == 0, pruned.output
        assert token.delete("/keys/vic").status_code == 204
        # The day, as the audit log tells it (oldest first).
        assert vic.get("/audit").status_code == 401  # revoked
        assert olga.get("/audit").status_code == 403
        entries = token.get("/audit").json()["entries"][::-1]
        here = socket.gethostname()
        told = [(e["action"], e["actor"], e["target"], e["address"]) for e in entries]
        api = "127.0.0.1"
        assert told == [
            ("key.add", "token", "olga", api),
            ("key.add", "token", "alice", api),
            ("key.add", "token", "vic", api),
            ("run.submit", "olga", first, api),
            ("approval.approve", "alice", first, api),
            ("run.submit", "olga", second, api),
            ("approval.reject", "alice", second, api),
            ("run.submit", "olga", third, api),
            ("run.cancel", "token", third, api),
            ("run.resume", "olga", third, api),
            ("run.cancel", "olga", third, api),
            ("run.rerun", "olga", fourth, api),
            ("schedule.add", "olga", "ledger", api),
            ("schedule.pause", "olga", "ledger", api),
            ("schedule.resume", "token", "ledger", api),
            ("schedule.remove", "olga", "ledger", api),
            ("history.prune", cli_actor(), "runs", here),
            ("key.revoke", "token", "vic", api),
        ]
        assert all(e["project"] == "default" for e in entries)
        by = {e["action"]: e["detail"] for e in entries}
        assert by["approval.reject"]["reason"] == "friday"
        assert by["approval.reject"]["tool"] == "shout"
        assert by["run.rerun"] == {"recipe": "release", "parent": first, "from_step": "after"}
        assert by["history.prune"]["runs"] == 1
        assert by["key.add"] == {"role": "viewer"}
        for entry in entries:
            assert all(key not in json.dumps(entry) for key in made.values())
        # Filters, together, and pages.
        alices = token.get("/audit", params={"actor": "alice"}).json()["entries"]
        assert [e["action"] for e in alices] == ["approval.reject", "approval.approve"]
        schedule = token.get("/audit", params={"action": "schedule", "actor": "olga"}).json()
        assert [e["action"] for e in schedule["entries"]] == [
            "schedule.remove",
            "schedule.pause",
            "schedule.add",
        ]
        cancels = token.get("/audit", params={"action": "run.cancel"}).json()["entries"]
        assert [e["actor"] for e in cancels] == ["olga", "token"]
        later = token.get("/audit", params={"since": time.time() + 3600}).json()
        assert later == {"entries": [], "next_cursor": None}
        pages: list[dict[str, Any]] = []
        cursor: int | None = None
        while True:
            params: dict[str, Any] = {"limit": 5} | ({"cursor": cursor} if cursor else {})
            page = token.get("/audit", params=params).json()
            pages += page["entries"]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert [e["id"] for e in pages] == [e["id"] for e in entries[::-1]]
        # `minions audit` reads the same log from the store.
        cli_json = runner.invoke(cli, ["audit", "--actor", "alice", "--json", *store])
        assert cli_json.exit_code == 0, cli_json.output
        assert [e["action"] for e in json.loads(cli_json.stdout)] == [
            "approval.reject",
            "approval.approve",
        ]
        table = runner.invoke(cli, ["audit", "--since", "1h", "--action", "key", *store])
        assert table.exit_code == 0, table.output
        assert "key.revoke" in table.output
        assert "run.submit" not in table.output
        for client in (token, olga, alice, vic):
            client.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("audit")
    url = f"sqlite:///{folder / 'store' / 'minions.db'}"
    config = ServiceConfig(token=TOKEN, database_url=url, recipes=write_recipes(folder / "r"))
    with app_in_thread(create_app(config)) as base:
        yield base


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"action": "run.explode"}, 400),
        ({"action": "Run"}, 400),
        ({"action": "x" * 41}, 422),
        ({"since": "yesterday"}, 422),
        ({"since": -1}, 422),
        ({"since": "nan"}, 422),
        ({"since": 2.0**41}, 422),
        ({"limit": 0}, 422),
        ({"limit": 1001}, 422),
        ({"cursor": "abc"}, 422),
        ({"cursor": 0}, 422),
        ({"cursor": 2**63}, 422),
        ({"actor": "a" * 201}, 422),
        ({"actor": "\u0000"}, 400),
        ({"project": "p" * 65}, 422),
    ],
)
def test_bad_audit_queries_are_refused_never_a_500(
    served: str, params: dict[str, Any], status: int
) -> None:
    answer = httpx2.get(f"{served}/audit", params=params, headers=auth(), timeout=60)
    assert answer.status_code == status, answer.text
    assert "error" in answer.json() or "detail" in answer.json()


def test_bad_audit_options_are_exit_2(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    asyncio.run(_made(url))
    runner = CliRunner()
    for wrong in (
        ["audit", "--action", "nope"],
        ["audit", "--since", "last tuesday"],
        ["audit", "--limit", "0"],
        ["worker", "--audit-retention", "soon"],
    ):
        refused = runner.invoke(cli, [*wrong, "--database-url", url])
        assert refused.exit_code == 2, (wrong, refused.output)
        assert "Traceback" not in refused.output
    empty = runner.invoke(cli, ["audit", "--database-url", url])
    assert empty.exit_code == 0
    assert "no changes recorded" in empty.output


async def _made(url: str) -> None:
    store = RunStore(url, create=True)
    await store.aclose()


# -- the store ------------------------------------------------------------------------------


async def test_an_entry_commits_with_its_change_or_neither_does(url: str, tmp_path: Path) -> None:
    """The entry is written in the change's transaction: when it cannot be written, the
    change is not made either (a cancel, a schedule's pause, a key's revoke)."""
    recipes = write_recipes(tmp_path / "recipes")
    store = RunStore(url, create=True)
    who = Actor(name="olga", address="10.0.0.7")
    run_id, _ = await store.submit(recipes / "approval.yaml", actor=who)
    await store.add_key("rita", role="viewer", actor=who)
    [entry, added] = await store.audit()
    assert (entry.action, entry.actor, entry.address, entry.target) == (
        "key.add",
        "olga",
        "10.0.0.7",
        "rita",
    )
    assert added.action == "run.submit"
    assert added.target == run_id
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as db:  # the audit log refuses every write from now on
        db.execute(sa.text("ALTER TABLE minions_audit RENAME TO minions_audit_away"))
    with pytest.raises(Exception):  # noqa: B017 (the database's own error)
        await store.cancel(run_id, actor=who)
    with pytest.raises(Exception):  # noqa: B017
        await store.revoke_key("rita", actor=who)
    record = await store.get(run_id)
    assert (record.status, record.cancel_requested, record.cancelled_by) == ("queued", False, None)
    assert [k.name for k in await store.keys()] == ["rita"]
    with engine.begin() as db:
        db.execute(sa.text("ALTER TABLE minions_audit_away RENAME TO minions_audit"))
    engine.dispose()
    await store.cancel(run_id, actor=who)
    assert [e.action for e in await store.audit(limit=1)] == ["run.cancel"]
    # A change that changed nothing records nothing: a second cancel is refused.
    with pytest.raises(Exception, match="nothing to cancel"):
        await store.cancel(run_id, actor=who)
    assert len(await store.audit()) == 3
    await store.aclose()


async def test_the_audit_keeps_its_own_horizon(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    store = RunStore(url, create=True)
    await store.add_key("old", role="viewer", actor="cli:ops")
    engine = sa.create_engine(url)
    with engine.begin() as db:
        db.execute(sa.text("UPDATE minions_audit SET at = at - 400 * 86400"))
    engine.dispose()
    await store.add_key("new", role="viewer", actor="cli:ops")
    assert await store.prune_audit("365d") == 1
    assert [e.target for e in await store.audit()] == ["audit", "new"]  # the prune, then "new"
    with pytest.raises(ValueError):
        await store.prune_audit("a while")
    await store.aclose()


def test_an_older_store_gets_the_audit_table(tmp_path: Path) -> None:
    """A store of schema 5 is migrated to 6: its audit log starts empty, and works."""
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    asyncio.run(_made(url))
    engine = sa.create_engine(url)
    with engine.begin() as db:
        db.execute(sa.text("DROP TABLE minions_audit"))
        db.execute(sa.text("UPDATE minions_meta SET value = '5' WHERE key = 'schema_version'"))
    engine.dispose()

    async def use() -> list[str]:
        store = RunStore(url)
        await store.add_key("ann", role="viewer", actor="cli:ops")
        found = [e.action for e in await store.audit()]
        await store.aclose()
        return found

    assert asyncio.run(use()) == ["key.add"]


async def test_a_schedules_runs_are_submitted_by_the_schedule(tmp_path: Path) -> None:
    from minions.runs._db import Database
    from minions.runs._queue import Queue
    from minions.runs._schedules import Scheduler, Timing

    url = f"sqlite:///{tmp_path / 'minions.db'}"
    recipes = write_recipes(tmp_path / "recipes")
    store = RunStore(url, create=True)
    await store.add_schedule(
        recipes / "recipe.yaml", every="5m", name="nightly", inputs={"tag": "n"}, actor="olga"
    )
    blocking, queue = Database(url), Queue(url)
    queue.client()
    first = Timing(every=300).after((await store.schedule("nightly")).created_at)
    [run_id] = Scheduler(blocking, queue.enqueue, clock=lambda: first + 1).tick()
    fired, added = await store.audit()
    assert (fired.action, fired.actor, fired.target) == ("run.submit", "schedule:nightly", run_id)
    assert fired.detail == {"recipe": "ledger", "schedule": "nightly", "slot": first}
    assert (added.action, added.actor, added.detail["every"]) == ("schedule.add", "olga", 300)
    blocking.close()
    queue.close()
    await store.aclose()
