"""Every state change records its actor, generated from the surfaces themselves, so a new
route or command cannot forget it: each state-changing route of the app (POST, PUT, PATCH,
DELETE), called by a key of project A, writes one audit entry naming the key, when, the
client's address, what it changed and A; each `minions` command is classed as one that
changes the store (and each of those, run here, writes its entries as ``cli:USER`` from
this machine) or one that does not. Then the gaps closed: ``endpoints forget`` (lifting a
pause too), ``cache clear``, a durable eval (its start, its case runs, its end) and the
audit log's own prune; and tenancy: A's entries name A, and no key of a project reads
``/audit`` (admins only)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx2
import pytest
import sqlalchemy as sa
import typer
from runs_helpers import WorkerProcess, run_here
from service_helpers import TOKEN, app_in_thread, auth, write_recipes
from typer.core import TyperGroup
from typer.testing import CliRunner

from minions.cli import app as cli
from minions.cli._common import cli_actor
from minions.runs import AUDIT_ACTIONS, AuditEntry, RunStore
from minions.service import ServiceConfig, create_app

A, B = "team-a", "team-b"
CHANGING = ("POST", "PUT", "PATCH", "DELETE")
API = "127.0.0.1"


async def _parked_and_failed(store: RunStore, recipes: Path, project: str) -> dict[str, str]:
    """A run of `project` parked at its approval (`waiting`, its call) and one that failed."""
    from minions.runs._runner import RunFailedError

    waiting, _ = await store.submit(recipes / "approval.yaml", project=project)
    await run_here(store.url, waiting)
    [asked] = (await store.get(waiting)).approvals
    failed, _ = await store.submit(recipes / "flaky.yaml", project=project)
    with pytest.raises(RunFailedError):
        await run_here(store.url, failed)
    return {"waiting": waiting, "call": asked.call_id, "failed": failed}


def _new(entries: list[AuditEntry], after: int) -> list[AuditEntry]:
    """The entries after id `after`, oldest first."""
    return sorted((e for e in entries if e.id > after), key=lambda e: e.id)


# -- every route that changes state ----------------------------------------------------------


@dataclass
class Served:
    base: str
    url: str
    keys: dict[str, str]
    ids: dict[str, str] = field(default_factory=dict)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("audited")
    recipes = write_recipes(folder / "recipes")
    url = f"sqlite:///{folder / 'store' / 'minions.db'}"
    mp = pytest.MonkeyPatch()
    mp.setenv("FLAKY_OK", str(folder / "never"))
    mp.setenv("LEDGER", str(folder / "ledger.txt"))

    async def make() -> tuple[dict[str, str], dict[str, str]]:
        store = RunStore(url, create=True)
        keys = {}
        for name, role, projects in (
            ("olga", "operator", [A]),
            ("alice", "approver", [A]),
            ("vic", "viewer", [A]),
            ("bob", "operator", [B]),
            ("boss", "admin", []),
        ):
            keys[name] = (await store.add_key(name, role=role, projects=projects)).key
        ids = await _parked_and_failed(store, recipes, A)
        await store.aclose()
        return keys, ids

    keys, ids = asyncio.run(make())
    config = ServiceConfig(token=TOKEN, database_url=url, recipes=recipes)
    with app_in_thread(create_app(config)) as base:
        yield Served(base=base, url=url, keys=keys, ids=ids)
    mp.undo()


@dataclass(frozen=True)
class Change:
    """How the walk calls a route that changes state, and the entry it must write."""

    action: str
    path: Callable[[dict[str, str]], str]
    body: dict[str, Any] | None = None
    target: Callable[[dict[str, str], dict[str, Any]], str] | None = None
    """What the entry names (default: the id in the path); given the ids and the answer."""
    project: str = A


CHANGES: dict[str, Change] = {
    "POST /keys": Change(
        "key.add", lambda ids: "/keys", {"name": "kim", "role": "viewer"},
        target=lambda ids, answer: "kim", project="default",
    ),
    "DELETE /keys/{name}": Change(
        "key.revoke", lambda ids: "/keys/kim", target=lambda ids, answer: "kim",
        project="default",
    ),
    "POST /runs": Change(
        "run.submit", lambda ids: "/runs", {"recipe": "release"},
        target=lambda ids, answer: ids.setdefault("submitted", answer["run_id"]),
    ),
    "POST /runs/{run_id}/cancel": Change(
        "run.cancel", lambda ids: f"/runs/{ids['submitted']}/cancel",
        target=lambda ids, answer: ids["submitted"],
    ),
    "POST /runs/{run_id}/rerun": Change(
        "run.rerun", lambda ids: f"/runs/{ids['failed']}/rerun", {"from_step": "second"},
        target=lambda ids, answer: answer["run_id"],
    ),
    "POST /runs/{run_id}/resume": Change(
        "run.resume", lambda ids: f"/runs/{ids['failed']}/resume",
        target=lambda ids, answer: ids["failed"],
    ),
    "POST /runs/{run_id}/approvals/{call_id:path}": Change(
        "approval.approve",
        lambda ids: f"/runs/{ids['waiting']}/approvals/{quote(ids['call'])}",
        {"approve": True},
        target=lambda ids, answer: ids["waiting"],
    ),
    "POST /schedules": Change(
        "schedule.add", lambda ids: "/schedules",
        {"recipe": "ledger", "every": "1h", "name": "nightly-a", "inputs": {"tag": "s"}},
        target=lambda ids, answer: "nightly-a",
    ),
    "POST /schedules/{name}/pause": Change(
        "schedule.pause", lambda ids: "/schedules/nightly-a/pause",
        target=lambda ids, answer: "nightly-a",
    ),
    "POST /schedules/{name}/resume": Change(
        "schedule.resume", lambda ids: "/schedules/nightly-a/resume",
        target=lambda ids, answer: "nightly-a",
    ),
    "DELETE /schedules/{name}": Change(
        "schedule.remove", lambda ids: "/schedules/nightly-a",
        target=lambda ids, answer: "nightly-a",
    ),
}  # fmt: skip
"""Each route that changes state, in the order the walk calls it."""
CHANGES_NOTHING = {
    "POST /runs/{run_id}/events/ticket": "a signed ticket for one run's stream: nothing stored",
    "POST /runs/{run_id}/rerun/preview": "a rerun planned, nothing queued (tests/test_rerun.py)",
}
"""Routes that take a POST (PUT, PATCH, DELETE) yet change no state, and why."""
CALLER = {"operate": "olga", "approve": "alice", "admin": "boss"}
"""The key that calls a route of each permission: a key of project A but for admins'."""


def changing_routes() -> dict[str, str]:
    """Each route of the app that may change state (``METHOD path``), with its permission."""
    from minions.service._access import api_routes, permission_of

    app = create_app(ServiceConfig(token=TOKEN))
    return {
        f"{method} {path}": str(permission_of(route))
        for method, path, route in api_routes(app)
        if method in CHANGING
    }


def test_every_route_that_changes_state_records_who_when_from_where_and_the_project(
    served: Served,
) -> None:
    routes = changing_routes()
    unknown = sorted(set(routes) - set(CHANGES) - set(CHANGES_NOTHING))
    assert not unknown, (
        f"{unknown}: say which audit entry each writes (CHANGES), or why it changes nothing "
        "(CHANGES_NOTHING)"
    )
    assert set(CHANGES) | set(CHANGES_NOTHING) == set(routes)
    assert {c.action for c in CHANGES.values()} <= set(AUDIT_ACTIONS)
    admin = httpx2.Client(base_url=served.base, headers=auth(), timeout=30)
    last = admin.get("/audit", params={"limit": 1}).json()["entries"][0]["id"]
    for route, change in CHANGES.items():
        name = CALLER[routes[route]]
        client = httpx2.Client(base_url=served.base, headers=auth(served.keys[name]), timeout=30)
        method = route.split(" ", 1)[0]
        before = time.time()
        answer = client.request(method, change.path(served.ids), json=change.body)
        after = time.time()
        assert answer.status_code in (200, 201, 204), (route, answer.text)
        body = answer.json() if answer.content else {}
        entries = admin.get("/audit", params={"limit": 10}).json()["entries"]
        new = [e for e in entries if e["id"] > last]
        assert [e["action"] for e in new] == [change.action], (route, new)
        [entry] = new
        target = change.target(served.ids, body) if change.target else ""
        assert (entry["actor"], entry["address"], entry["target"], entry["project"]) == (
            name,
            API,
            target,
            change.project,
        ), route
        assert before - 1 <= entry["at"] <= after + 1, route
        last = entry["id"]
    # A request refused writes nothing: a cancel of a run that ended, a key without the role.
    olga = httpx2.Client(base_url=served.base, headers=auth(served.keys["olga"]), timeout=30)
    assert olga.post(f"/runs/{served.ids['submitted']}/cancel").status_code == 409
    assert olga.post("/keys", json={"name": "eve", "role": "admin"}).status_code == 403
    assert admin.get("/audit", params={"limit": 1}).json()["entries"][0]["id"] == last


def test_audit_entries_of_a_project_name_it_and_no_key_of_a_project_reads_the_log(
    served: Served,
) -> None:
    """`GET /audit` is for admins (every project); a key of a project, whatever its role,
    gets a 403 and no entry, and A's changes are filed under A, never under B or default."""
    bob = httpx2.Client(base_url=served.base, headers=auth(served.keys["bob"]), timeout=30)
    submitted = bob.post("/runs", json={"recipe": "release"})
    assert submitted.status_code == 201, submitted.text
    b_run = submitted.json()["run_id"]
    assert bob.post(f"/runs/{b_run}/cancel").status_code == 200
    # B's key cannot act on A's run (404), so it wrote nothing of A's.
    assert bob.post(f"/runs/{served.ids['waiting']}/cancel").status_code == 404
    for name in ("olga", "alice", "vic", "bob"):
        key = httpx2.Client(base_url=served.base, headers=auth(served.keys[name]), timeout=30)
        for params in ({}, {"project": A}, {"project": B}):
            refused = key.get("/audit", params=params)
            assert refused.status_code == 403, (name, refused.text)
            assert served.ids["waiting"] not in refused.text
            assert b_run not in refused.text
    boss = httpx2.Client(base_url=served.base, headers=auth(served.keys["boss"]), timeout=30)
    of_b = boss.get("/audit", params={"project": B}).json()["entries"]
    assert [(e["action"], e["actor"], e["target"]) for e in of_b] == [
        ("run.cancel", "bob", b_run),
        ("run.submit", "bob", b_run),
    ]
    of_a = boss.get("/audit", params={"project": A, "limit": 1000}).json()["entries"]
    assert of_a
    assert all(e["actor"] in ("olga", "alice", None) for e in of_a), of_a
    assert b_run not in json.dumps(of_a)
    a_runs = {served.ids["waiting"], served.ids["failed"], served.ids["submitted"]}
    default = boss.get("/audit", params={"project": "default", "limit": 1000}).json()["entries"]
    assert not a_runs & {e["target"] for e in default}
    assert {e["action"].split(".")[0] for e in default} == {"key"}
    # The same on the store: `minions audit --project`.
    shown = CliRunner().invoke(
        cli, ["audit", "--project", B, "--json", "--database-url", served.url]
    )
    assert shown.exit_code == 0, shown.output
    assert [e["target"] for e in json.loads(shown.stdout)] == [b_run, b_run]
    table = CliRunner().invoke(cli, ["audit", "--project", A, "--database-url", served.url])
    assert A in table.output
    assert b_run not in table.output
    bad = CliRunner().invoke(cli, ["audit", "--project", "no/such", "--database-url", served.url])
    assert bad.exit_code == 2, bad.output


# -- every command that changes the store ----------------------------------------------------


ELSEWHERE = {
    "worker": "its own changes are the system's: retention's prunes (history.prune, "
    "audit.prune) and approvals' timeouts (approval.reject, as timeout) from the worker's "
    "id, a schedule's runs (run.submit, as schedule:NAME): tests of each",
    "serve": "its routes: the walk of every route above",
    "eval run": "with --durable, eval.start, run.submit and eval.finish: "
    "test_a_durable_eval_records_who_ran_it (it needs a worker); in the foreground, no store",
}
"""Commands that change the store, tested elsewhere."""
READS = {
    "run", "validate", "graph", "schema", "plan", "audit", "workers", "queue", "usage",
    "runs list", "runs show", "runs step", "runs events", "runs diff",
    "schedules list", "schedules show", "endpoints status", "endpoints list", "keys list",
    "eval compare", "eval add-case", "cache list",
}  # fmt: skip
"""Commands that change no store (``eval add-case`` writes a dataset file)."""


def commands() -> set[str]:
    """Every `minions` command (``group command`` for a group's), from the app itself."""
    found = set()
    root = typer.main.get_command(cli)
    assert isinstance(root, TyperGroup)
    for name, command in root.commands.items():
        if isinstance(command, TyperGroup):
            found |= {f"{name} {sub}" for sub in command.commands}
        else:
            found.add(name)
    return found


def test_every_command_that_changes_the_store_records_who_from_this_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipes = write_recipes(tmp_path / "recipes")
    monkeypatch.setenv("FLAKY_OK", str(tmp_path / "never"))
    monkeypatch.setenv("LEDGER", str(tmp_path / "ledger.txt"))
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    endpoint = "http://127.0.0.1:9/v1"

    async def made() -> dict[str, str]:
        store = RunStore(url, create=True)
        try:
            return await _parked_and_failed(store, recipes, A)
        finally:
            await store.aclose()

    ids = asyncio.run(made())
    engine = sa.create_engine(url)
    with engine.begin() as db:  # what `endpoints forget` and `cache clear` delete
        db.execute(
            sa.text(
                "INSERT INTO minions_capabilities (base_url, model, rejected, worked, learned_at) "
                "VALUES (:url, 'qwen', '[\"json_schema\"]', 'tool', :at)"
            ),
            {"url": endpoint, "at": time.time()},
        )
        db.execute(
            sa.text("INSERT INTO minions_endpoint_gates (endpoint, paused_until) VALUES (:e, :u)"),
            {"e": endpoint, "u": time.time() + 3600},
        )
        db.execute(
            sa.text(
                "INSERT INTO minions_step_cache (key, step_id, output, usage, created_at, "
                "recipe_id) VALUES ('k', 's', '{}', '{}', :at, 'ledger')"
            ),
            {"at": time.time()},
        )
    engine.dispose()
    runner = CliRunner()
    ledger = str(recipes / "recipe.yaml")
    # (command, its arguments, the actions it writes, the target, the project); `{submitted}`
    # is the run the first one prints.
    walk: list[tuple[str, list[str], list[str], str, str]] = [
        ("submit", [str(recipes / "approval.yaml"), "--project", A], ["run.submit"], "{submitted}", A),
        ("runs cancel", ["{submitted}"], ["run.cancel"], "{submitted}", A),
        ("runs resume", ["{submitted}"], ["run.resume"], "{submitted}", A),
        ("runs approve", [ids["waiting"], ids["call"]], ["approval.approve"], ids["waiting"], A),
        ("runs rerun", [ids["failed"], "--from", "second"], ["run.rerun"], "{printed}", A),
        ("runs prune", ["--older-than", "3650d"], ["history.prune"], "runs", "default"),
        ("schedules add", [ledger, "--every", "1h", "--name", "n", "-i", "tag=s", "--project", A], ["schedule.add"], "n", A),
        ("schedules pause", ["n"], ["schedule.pause"], "n", A),
        ("schedules resume", ["n"], ["schedule.resume"], "n", A),
        ("schedules remove", ["n"], ["schedule.remove"], "n", A),
        ("keys add", ["kim", "--role", "viewer"], ["key.add"], "kim", "default"),
        ("keys revoke", ["kim"], ["key.revoke"], "kim", "default"),
        ("endpoints forget", [endpoint], ["endpoint.forget", "endpoint.lift"], endpoint, "default"),
        ("cache clear", [], ["cache.clear"], "cache", "default"),
    ]  # fmt: skip
    everything = commands()
    changing = {command for command, *_ in walk}
    unknown = sorted(everything - changing - set(ELSEWHERE) - READS)
    assert not unknown, f"{unknown}: say which audit entries each writes, or that it only reads"
    assert changing | set(ELSEWHERE) | READS == everything

    async def audit() -> list[AuditEntry]:
        store = RunStore(url)
        try:
            return await store.audit(limit=1000)
        finally:
            await store.aclose()

    last = max(e.id for e in asyncio.run(audit()))
    values: dict[str, str] = {}
    for command, args, actions, target, project in walk:
        given = [a.format(**values) for a in args]
        before = time.time()
        done = runner.invoke(cli, [*command.split(), *given, "--database-url", url])
        after = time.time()
        assert done.exit_code == 0, (command, done.output)
        if command == "submit":
            values["submitted"] = done.stdout.strip()
        values["printed"] = done.stdout.strip()
        new = _new(asyncio.run(audit()), last)
        assert [e.action for e in new] == actions, (command, new)
        for entry in new:
            assert (entry.actor, entry.address) == (cli_actor(), socket.gethostname()), command
            assert (entry.target, entry.project) == (target.format(**values), project), command
            assert before - 1 <= entry.at <= after + 1, command
        last = new[-1].id
    told = {e.action: e.detail for e in asyncio.run(audit())}
    assert told["endpoint.forget"] == {"forgotten": 1}
    assert told["endpoint.lift"] == {"lifted": 1}
    assert told["cache.clear"] == {"cleared": 1}
    # Forgetting one model of an endpoint names it; clearing one recipe's cache names it.
    for command, args in (
        ("endpoints forget", [f"{endpoint}#qwen"]),
        ("cache clear", ["--recipe", "ledger"]),
    ):
        assert runner.invoke(cli, [*command.split(), *args, "--database-url", url]).exit_code == 0
    forgot, cleared = _new(asyncio.run(audit()), last)[::2]
    assert (forgot.action, forgot.target) == ("endpoint.forget", f"{endpoint}#qwen")
    assert (cleared.action, cleared.detail) == ("cache.clear", {"recipe": "ledger", "cleared": 0})


def test_the_audit_help_names_every_family_of_actions() -> None:
    from minions.cli._audit import FAMILIES

    assert FAMILIES.split(", ") == list(dict.fromkeys(a.split(".")[0] for a in AUDIT_ACTIONS))
    shown = CliRunner().invoke(cli, ["audit", "--help"])
    assert "--project" in shown.output


# -- evals on the workers --------------------------------------------------------------------

CAPITAL = """\
id: capital
inputs: {country: {type: string}}
steps:
  - id: answer
    goal: "What is the capital of {{ inputs.country }}? One word."
"""
CASES = """\
recipe: capital.yaml
checks:
  - expr: "steps.answer.status == 'completed'"
cases:
  - id: france
    inputs: {country: France}
"""


def test_a_durable_eval_records_who_ran_it(tmp_path: Path) -> None:
    """`minions eval --durable --project P`: its start, its case run and its end are the
    person's at this machine, in P; started again (the same eval, finished), it is a new
    eval."""
    from minions.testing import FakeOpenAIServer

    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    folder = tmp_path / "evals"
    folder.mkdir()
    (folder / "capital.yaml").write_text(CAPITAL)
    (folder / "cases.yaml").write_text(CASES)
    ledger = tmp_path / "ledger.txt"
    with FakeOpenAIServer(lambda request: "Paris") as server:
        env = {"MINIONS_MODEL": f"openai-compatible:m@{server.url}", "OPENAI_API_KEY": "sk-t"}
        asyncio.run(_made(url))
        worker = WorkerProcess(url, tmp_path, "w1", ledger, **env)
        try:
            done = CliRunner().invoke(
                cli,
                ["eval", str(folder / "cases.yaml"), "--durable", "--project", A,
                 "--database-url", url],
            )  # fmt: skip
        finally:
            worker.stop()
    assert done.exit_code == 0, done.output

    async def audit() -> tuple[list[AuditEntry], list[Any]]:
        store = RunStore(url)
        try:
            return await store.audit(), await store.evals()
        finally:
            await store.aclose()

    entries, evals = asyncio.run(audit())
    [kept] = evals
    started, submitted, finished = entries[::-1]
    assert (started.action, started.target) == ("eval.start", kept.eval_id)
    assert started.detail == {"dataset": "cases", "target": "capital", "total": 1}
    assert submitted.action == "run.submit"
    assert (finished.action, finished.target) == ("eval.finish", kept.eval_id)
    assert (finished.detail["pass_rate"], finished.detail["ok"]) == (1.0, True)
    for entry in entries:
        assert (entry.actor, entry.address, entry.project) == (
            cli_actor(),
            socket.gethostname(),
            A,
        ), entry


async def _made(url: str) -> None:
    store = RunStore(url, create=True)
    await store.aclose()


async def test_an_eval_resumed_writes_no_second_start(url: str) -> None:
    store = RunStore(url, create=True)
    try:
        first, _ = await store.open_eval(
            "f", dataset="d", target="t", total=1, project=A, actor="x"
        )
        again, resumed = await store.open_eval("f", dataset="d", target="t", total=1, actor="y")
        assert resumed
        assert again.eval_id == first.eval_id
        await store.keep_eval(
            first, {"cases": []}, summary={"pass_rate": 0.5, "ok": False}, actor="y"
        )
        finish, start = await store.audit()
        assert (start.action, start.actor, start.project) == ("eval.start", "x", A)
        assert (finish.action, finish.actor, finish.project) == ("eval.finish", "y", A)
        assert finish.detail == {"dataset": "d", "pass_rate": 0.5, "ok": False}
    finally:
        await store.aclose()


# -- the store: the project of each change, the audit's own prune ----------------------------


async def test_each_change_of_a_projects_run_or_schedule_is_filed_under_its_project(
    url: str, tmp_path: Path
) -> None:
    """The actor says who; the project is the changed thing's, read in the change's
    transaction (a key's actor names no project)."""
    recipes = write_recipes(tmp_path / "recipes")
    store = RunStore(url, create=True)
    try:
        ids = await _parked_and_failed(store, recipes, B)
        await store.approve(ids["waiting"], ids["call"], approved=False, reason="no", actor="ann")
        await store.resume(ids["failed"], actor="ann")
        await store.cancel(ids["failed"], actor="ann", wait=0)
        await store.add_schedule(
            recipes / "recipe.yaml", every="1h", name="s", inputs={"tag": "t"}, project=B,
            actor="ann",
        )  # fmt: skip
        await store.add_schedule(
            recipes / "recipe.yaml", every="2h", name="s", inputs={"tag": "t"}, project=B,
            replace=True, actor="ann",
        )  # fmt: skip
        await store.pause_schedule("s", actor="ann")
        await store.resume_schedule("s", actor="ann")
        await store.remove_schedule("s", actor="ann")
        told = [(e.action, e.project) for e in await store.audit(actor="ann")][::-1]
        assert told == [
            ("approval.reject", B),
            ("run.resume", B),
            ("run.cancel", B),
            ("schedule.add", B),
            ("schedule.replace", B),
            ("schedule.pause", B),
            ("schedule.resume", B),
            ("schedule.remove", B),
        ]
        assert {e.project for e in await store.audit(action="run.submit")} == {B}
    finally:
        await store.aclose()


async def test_the_audit_logs_own_prune_is_recorded_when_it_deleted_some(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    store = RunStore(url, create=True)
    try:
        await store.add_key("old", role="viewer", actor="cli:ops")
        engine = sa.create_engine(url)
        with engine.begin() as db:
            db.execute(sa.text("UPDATE minions_audit SET at = at - 400 * 86400"))
        engine.dispose()
        assert await store.prune_audit("365d", actor="cli:ops") == 1
        [pruned] = await store.audit()
        assert (pruned.action, pruned.actor, pruned.target) == ("audit.prune", "cli:ops", "audit")
        assert pruned.detail == {"older_than": "365d", "entries": 1}
        assert await store.prune_audit("365d", actor="cli:ops") == 0  # nothing: no entry
        assert [e.action for e in await store.audit()] == ["audit.prune"]
    finally:
        await store.aclose()
