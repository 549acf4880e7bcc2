"""Projects: teams kept apart on one store. The tenancy proof of the GHSA-747p-c922-m55f class,
generated from the app's own routes (a new route that takes an id is covered, or fails the
test until it says how to fill its id): a key of project A using ids of project B gets a 404
for every route, and nothing of B changes; listings and streams never show B's rows. Then the
contracts of submitting into a project (a key of one project, of several, an admin), the
idempotency keys and schedule names that projects share, the one-place rule (a route that
takes the whole store, or an id without the scoped store, stops the app from starting), the
scoped store on SQLite and Postgres, the store's migration, and `--project` on the CLI."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import sqlalchemy as sa
from fastapi import APIRouter, FastAPI
from runs_helpers import run_here
from service_helpers import TOKEN, app_in_thread, auth, write_recipes
from typer.testing import CliRunner

from minions.cli import app as cli
from minions.errors import UnknownProjectError, UnknownRunError, UnknownScheduleError
from minions.runs import RunStore, Scope
from minions.service import ServiceConfig, create_app
from minions.service._access import Reader
from minions.service._deps import Runs, WholeStore

A, B = "team-a", "team-b"
DOCS = Path(__file__).resolve().parent.parent / "docs"


@dataclass(frozen=True)
class Tenants:
    base: str
    keys: dict[str, str]
    """Keys by name: ``alice`` (operator of A), ``bob`` (operator of B), ``multi`` (operator
    of A and B), ``boss`` (admin, no project named)."""
    a: dict[str, str]
    """A's ids: ``failed``, ``waiting``, ``schedule``, ``eval``."""
    b: dict[str, str]
    """B's ids, the same."""
    url: str


async def _tenant(store: RunStore, folder: Path, project: str) -> dict[str, str]:
    """A failed run (a rerun and diff target), a run waiting for an approval, a schedule and
    an eval, all of `project`."""
    from minions.runs._runner import RunFailedError

    failed, _ = await store.submit(folder / "flaky.yaml", project=project)
    with pytest.raises(RunFailedError):
        await run_here(store.url, failed)
    waiting, _ = await store.submit(folder / "approval.yaml", project=project)
    # As a worker leaves it at the approval (no worker runs here): waiting, the call asked.
    from minions.runs import _approvals
    from minions.runs._db import Database
    from minions.runs._tables import runs_table

    database = Database(store.url)
    with database.begin() as db:
        _approvals.request(
            database, db, waiting, call_id="call-1", step_id="say", tool="shout", arguments={}
        )
        db.execute(
            runs_table.update().where(runs_table.c.run_id == waiting).values(status="waiting")
        )
    database.close()
    schedule = await store.add_schedule(
        folder / "approval.yaml", every="1d", name=f"nightly-{project[-1]}", project=project
    )
    opened, _ = await store.open_eval(
        f"fingerprint-{project}", dataset="cases.yaml", target="ledger", total=1, project=project
    )
    return {
        "failed": failed,
        "waiting": waiting,
        "schedule": schedule.name,
        "eval": opened.eval_id,
    }


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    folder = tmp_path_factory.mktemp("projects")
    recipes = write_recipes(folder / "recipes")
    url = f"sqlite:///{folder / 'store' / 'minions.db'}"
    mp = pytest.MonkeyPatch()
    mp.setenv("FLAKY_OK", str(folder / "never"))
    mp.setenv("LEDGER", str(folder / "ledger.txt"))

    async def make() -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
        store = RunStore(url, create=True)
        keys = {
            "alice": (await store.add_key("alice", role="operator", projects=[A])).key,
            "bob": (await store.add_key("bob", role="operator", projects=[B])).key,
            "multi": (await store.add_key("multi", role="operator", projects=[A, B])).key,
            "boss": (await store.add_key("boss", role="admin")).key,
        }
        a = await _tenant(store, recipes, A)
        b = await _tenant(store, recipes, B)
        await store.aclose()
        return keys, a, b

    keys, a, b = asyncio.run(make())
    config = ServiceConfig(token=TOKEN, database_url=url, recipes=recipes, heartbeat=0.05)
    with app_in_thread(create_app(config)) as base:
        yield Tenants(base=base, keys=keys, a=a, b=b, url=url)
    mp.undo()


# -- what every id-taking route does with another project's ids --------------------------------

BODIES: dict[str, dict[str, Any]] = {
    "POST /runs/{run_id}/approvals/{call_id:path}": {"approve": True},
    "POST /runs/{run_id}/rerun": {"from_step": "second"},
    "POST /runs/{run_id}/rerun/preview": {"from_step": "second"},
}
"""A body each route would accept (a 422 would hide what the test is after)."""
RUN_OF: dict[str, str] = {
    "POST /runs/{run_id}/approvals/{call_id:path}": "waiting",
    "POST /runs/{run_id}/cancel": "waiting",
}
"""Which of a tenant's runs a route is aimed at (default: its failed run): one it would
change, were it allowed."""


def fill(route: str, ids: dict[str, str]) -> str:
    """The path of `route` with `ids` (a tenant's) in its parameters.

    Raises:
        AssertionError: a parameter this test does not know how to fill (a new route: say
            here which of the tenant's ids it takes).
    """
    path = route.split(" ", 1)[1]
    run = ids[RUN_OF.get(route, "failed")]
    values = {
        "run_id": run,
        "run_a": ids["failed"],
        "run_b": ids["waiting"],
        "call_id:path": "call-1",
        "step_id": "second",
        "name": ids["schedule"],
        "eval_id": ids["eval"],
    }

    def one(match: re.Match[str]) -> str:
        name = match[1]
        assert name in values, f"{route}: the tenancy test cannot fill {{{name}}}; add it"
        return values[name]

    return re.sub(r"\{([^}]+)\}", one, path)


def scoped_routes() -> list[str]:
    """Every route that takes an id and is not an admin's or public (``METHOD path``), from
    the app itself."""
    from minions.service._access import api_routes, permission_of

    app = create_app(ServiceConfig(token=TOKEN))
    return [
        f"{method} {path}"
        for method, path, route in api_routes(app)
        if "{" in path and permission_of(route) not in ("admin", "public")
    ]


def b_state(tenants: Tenants) -> Any:
    """Everything of B's that a request could change, as the store has it."""
    engine = sa.create_engine(tenants.url)
    with engine.connect() as db:
        runs = db.execute(
            sa.text(
                "SELECT run_id, status, cancel_requested, cancelled_by, attempt, last_seq "
                "FROM minions_runs WHERE project = :p ORDER BY run_id"
            ),
            {"p": B},
        ).all()
        approvals = db.execute(
            sa.text("SELECT run_id, call_id, decided_at, approved FROM minions_approvals")
        ).all()
        schedules = db.execute(
            sa.text("SELECT name, paused, version FROM minions_schedules WHERE project = :p"),
            {"p": B},
        ).all()
        every = db.execute(sa.text("SELECT COUNT(*) FROM minions_runs")).scalar_one()
    engine.dispose()
    return [list(map(tuple, runs)), list(map(tuple, approvals)), list(map(tuple, schedules)), every]


def test_every_id_taking_route_answers_404_to_another_projects_ids(tenants: Tenants) -> None:
    routes = scoped_routes()
    # The routes of the issue's list, at least (run, schedule, event stream, diff, rerun,
    # approval, step); a new one is in `routes` by itself.
    assert {
        "GET /runs/{run_id}",
        "GET /schedules/{name}",
        "GET /runs/{run_id}/events/stream",
        "GET /runs/{run_a}/diff/{run_b}",
        "POST /runs/{run_id}/rerun",
        "POST /runs/{run_id}/rerun/preview",
        "POST /runs/{run_id}/approvals/{call_id:path}",
        "GET /runs/{run_id}/steps/{step_id}",
    } <= set(routes)
    before = b_state(tenants)
    client = httpx2.Client(base_url=tenants.base, headers=auth(tenants.keys["alice"]), timeout=30)
    for route in routes:
        method = route.split(" ", 1)[0]
        response = client.request(method, fill(route, tenants.b), json=BODIES.get(route))
        assert response.status_code == 404, (route, response.status_code, response.text)
        kind = response.json()["error"]["type"]
        assert kind in ("unknown_run", "unknown_schedule", "unknown_eval"), (route, kind)
        assert "flaky" not in response.text, route
        assert "release" not in response.text, route
        # A diff of A's run with B's, either way round, is as unknown.
        if "{run_b}" in route:
            mixed = client.request(method, fill(route, tenants.a).replace(tenants.a["waiting"], tenants.b["failed"]))  # fmt: skip
            assert mixed.status_code == 404, (route, mixed.text)
    assert b_state(tenants) == before
    # The same ids are real: B's key (and the admin) read them; A's key reads A's.
    for key, ids in (("bob", tenants.b), ("boss", tenants.b), ("alice", tenants.a)):
        reader = httpx2.Client(base_url=tenants.base, headers=auth(tenants.keys[key]), timeout=30)
        for route in routes:
            if route.startswith("GET ") and not route.endswith("/stream"):
                got = reader.get(fill(route, ids))
                assert got.status_code == 200, (key, route, got.text)


def test_listings_and_streams_never_show_another_projects_rows(tenants: Tenants) -> None:
    from minions.service._access import api_routes, permission_of

    app = create_app(ServiceConfig(token=TOKEN))
    lists = [
        path
        for method, path, route in api_routes(app)
        if method == "GET" and "{" not in path and permission_of(route) == "read"
    ]
    assert {"/runs", "/schedules", "/evals", "/workers", "/recipes"} <= set(lists)
    markers = [*tenants.b.values(), B]
    alice = httpx2.Client(base_url=tenants.base, headers=auth(tenants.keys["alice"]), timeout=30)
    for path in lists:
        for query in ({}, {"project": B}, {"status": "failed"}):
            response = alice.get(path, params=query)
            if "project" in query and response.status_code == 404:  # a project not its own
                assert response.json()["error"]["type"] == "unknown_project"
                assert path in narrowing(), path
                continue  # (the answer names the project asked for, and nothing else)
            assert response.status_code == 200, (path, response.text)
            for marker in markers:
                assert marker not in response.text, (path, query, marker)
    runs = alice.get("/runs").json()
    assert {r["run_id"] for r in runs["runs"]} == {tenants.a["failed"], tenants.a["waiting"]}
    assert runs["total"] == 2
    assert {r["project"] for r in runs["runs"]} == {A}
    assert [s["name"] for s in alice.get("/schedules").json()] == [tenants.a["schedule"]]
    assert [e["eval_id"] for e in alice.get("/evals").json()["evals"]] == [tenants.a["eval"]]
    # The views that count rather than list count A's only: one waiting run, one call that
    # waits for alice, no notification target (the server's configuration).
    assert alice.get("/queue").json()["waiting"] == 1
    assert alice.get("/me").json()["waiting"] == 1
    assert alice.get("/notifications").json() == []
    boss = httpx2.Client(base_url=tenants.base, headers=auth(tenants.keys["boss"]), timeout=30)
    assert boss.get("/queue").json()["waiting"] == 2
    assert boss.get("/me").json()["waiting"] == 2
    # The admin and a key of both see both.
    for key in ("boss", "multi"):
        both = httpx2.Client(base_url=tenants.base, headers=auth(tenants.keys[key]), timeout=30)
        assert both.get("/runs").json()["total"] == 4
        assert both.get("/runs", params={"project": B}).json()["total"] == 2
    # A's ticket opens A's stream, not B's (a ticket is for one run, and one key's scope).
    ticket = alice.post(f"/runs/{tenants.a['failed']}/events/ticket").json()["ticket"]
    stranger = httpx2.Client(base_url=tenants.base, timeout=30)
    own = stranger.get(f"/runs/{tenants.a['failed']}/events/stream", params={"ticket": ticket})
    assert own.status_code == 200
    assert tenants.b["failed"] not in own.text
    other = stranger.get(f"/runs/{tenants.b['failed']}/events/stream", params={"ticket": ticket})
    assert other.status_code == 401


def narrowing() -> set[str]:
    """The paths of the app's GET routes that take ``?project=`` (from the app itself)."""
    from fastapi.dependencies.models import Dependant

    from minions.service._access import api_routes

    def queries(dependant: Dependant) -> set[str]:
        found = {q.name for q in dependant.query_params}
        for sub in dependant.dependencies:
            found |= queries(sub)
        return found

    app = create_app(ServiceConfig(token=TOKEN))
    return {
        path
        for method, path, route in api_routes(app)
        if method == "GET" and "project" in queries(route.dependant)
    }


LISTINGS = ("/runs", "/schedules", "/evals", "/queue", "/usage", "/me", "/workers")
"""What the console's project picker narrows."""


def listed(client: httpx2.Client, path: str, **query: str) -> Any:
    """What a listing shows, without the times that change between two reads."""
    response = client.get(path, params=query)
    assert response.status_code == 200, (path, query, response.text)
    body = response.json()
    if path == "/runs":
        return sorted(r["run_id"] for r in body["runs"]), body["total"]
    if path == "/schedules":
        return sorted(s["name"] for s in body)
    if path == "/evals":
        return sorted(e["eval_id"] for e in body["evals"])
    if path == "/queue":
        return body["queued"], body["running"], body["waiting"], [r["run_id"] for r in body["oldest"]]  # fmt: skip
    if path == "/usage":
        return body["total"]["calls"], body["total"]["prompt_tokens"]
    if path == "/me":
        return body["waiting"]
    return sorted(run for worker in body for run in worker["runs"])


def test_a_listing_narrowed_to_a_project_shows_that_projects_rows_only(
    tenants: Tenants,
) -> None:
    """``?project=P`` on every listing the console's picker narrows: an admin and a key of
    both projects see P's rows only, as a key of P alone sees them; a key naming a project
    not its own gets the 404 of `GET /runs?project=`, a name that cannot be a project a
    422; an admin naming a project nobody has sees nothing."""
    assert set(LISTINGS) <= narrowing()

    def client(name: str) -> httpx2.Client:
        return httpx2.Client(base_url=tenants.base, headers=auth(tenants.keys[name]), timeout=30)

    alice, bob = client("alice"), client("bob")
    for key in ("boss", "multi"):
        for project, own, ids in ((A, alice, tenants.a), (B, bob, tenants.b)):
            for path in LISTINGS:
                assert listed(client(key), path, project=project) == listed(own, path), (key, path)
            runs, _ = listed(client(key), "/runs", project=project)
            assert {ids["failed"], ids["waiting"]} <= set(runs)
            assert listed(client(key), "/schedules", project=project) == [ids["schedule"]]
            assert listed(client(key), "/evals", project=project) == [ids["eval"]]
            assert listed(client(key), "/me", project=project) == 1  # its waiting call
            assert listed(client(key), "/queue", project=project)[2] == 1
        # Unnarrowed, both projects' rows.
        assert listed(client(key), "/me") == 2
        assert listed(client(key), "/schedules") == sorted([tenants.a["schedule"], tenants.b["schedule"]])  # fmt: skip
    for path in LISTINGS:
        assert listed(alice, path, project=A) == listed(alice, path), path
        refused = alice.get(path, params={"project": B})
        assert refused.status_code == 404, (path, refused.text)
        assert refused.json()["error"]["type"] == "unknown_project"
        for marker in tenants.b.values():
            assert marker not in refused.text, (path, marker)
        for wrong in ("a/b", "", "-x", "x" * 65):
            bad = client("boss").get(path, params={"project": wrong})
            assert bad.status_code == 422, (path, wrong, bad.text)
        assert listed(client("boss"), path, project="nobodys") in ([], ([], 0), 0, (0, 0, 0, []), (0, 0))  # fmt: skip


def test_the_projects_a_key_may_pick(tenants: Tenants) -> None:
    def picks(name: str) -> list[str]:
        response = httpx2.get(
            f"{tenants.base}/projects", headers=auth(tenants.keys[name]), timeout=30
        )
        assert response.status_code == 200, response.text
        found: list[str] = response.json()
        return found

    assert picks("alice") == [A]
    assert picks("bob") == [B]
    assert picks("multi") == [A, B]
    assert picks("boss") == ["default", A, B]  # the store's: its runs', schedules', keys'


def test_a_ticket_carries_its_keys_scope(tenants: Tenants) -> None:
    """A ticket is the key's: issued to A's key for a run of B it is refused at once, and a
    ticket signed for B's run naming A's key (as if forged with the token) opens nothing."""
    import time

    from minions.service._tickets import Tickets

    alice = httpx2.Client(base_url=tenants.base, headers=auth(tenants.keys["alice"]), timeout=30)
    assert alice.post(f"/runs/{tenants.b['failed']}/events/ticket").status_code == 404
    store = RunStore(tenants.url)
    alice_id = asyncio.run(store.key_of(tenants.keys["alice"]))
    asyncio.run(store.aclose())
    assert alice_id is not None
    forged, _ = Tickets(TOKEN).issue(tenants.b["failed"], key_id=alice_id.id, now=time.time())
    stranger = httpx2.Client(base_url=tenants.base, timeout=30)
    opened = stranger.get(f"/runs/{tenants.b['failed']}/events/stream", params={"ticket": forged})
    assert opened.status_code == 404, opened.text


# -- submitting into a project ------------------------------------------------------------------


def test_a_run_belongs_to_the_project_of_the_key_that_submitted_it(tenants: Tenants) -> None:
    def client(name: str) -> httpx2.Client:
        return httpx2.Client(base_url=tenants.base, headers=auth(tenants.keys[name]), timeout=30)

    def project_of(run_id: str) -> str:
        found: str = client("boss").get(f"/runs/{run_id}").json()["project"]
        return found

    body = {"recipe": "flaky"}
    made = client("alice").post("/runs", json=body)
    assert made.status_code == 201
    assert project_of(made.json()["run_id"]) == A
    assert client("alice").post("/runs", json={**body, "project": A}).status_code == 201
    # A project not the key's is as unknown as one that does not exist.
    refused = client("alice").post("/runs", json={**body, "project": B})
    assert refused.status_code == 404
    assert refused.json()["error"]["type"] == "unknown_project"
    # A key of several projects names one; an admin may name any (default: default).
    several = client("multi").post("/runs", json=body)
    assert several.status_code == 400
    assert "team-a, team-b" in several.json()["error"]["message"]
    named = client("multi").post("/runs", json={**body, "project": B})
    assert project_of(named.json()["run_id"]) == B
    assert project_of(client("boss").post("/runs", json=body).json()["run_id"]) == "default"
    ops = client("boss").post("/runs", json={**body, "project": "ops"})
    assert project_of(ops.json()["run_id"]) == "ops"
    assert client("alice").get(f"/runs/{ops.json()['run_id']}").status_code == 404
    for wrong in ("", "a/b", "x" * 65, "-x"):
        bad = client("boss").post("/runs", json={**body, "project": wrong})
        assert bad.status_code == 422, (wrong, bad.text)
    # A rerun is of its parent's project, whoever reruns it.
    rerun = client("multi").post(f"/runs/{tenants.b['failed']}/rerun", json={"from_step": "second"})
    assert rerun.status_code == 201, rerun.text
    assert project_of(rerun.json()["run_id"]) == B


def test_an_idempotency_key_of_another_project_names_nothing_of_it(tenants: Tenants) -> None:
    bob = httpx2.Client(base_url=tenants.base, headers=auth(tenants.keys["bob"]), timeout=30)
    alice = httpx2.Client(base_url=tenants.base, headers=auth(tenants.keys["alice"]), timeout=30)
    body = {"recipe": "flaky", "idempotency_key": "deploy-42"}
    first = bob.post("/runs", json=body)
    assert first.status_code == 201
    again = alice.post("/runs", json=body)
    assert again.status_code == 409, again.text
    assert again.json()["error"]["type"] == "idempotency_conflict"
    assert first.json()["run_id"] not in again.text
    assert bob.post("/runs", json=body).json() == {**first.json(), "created": False}


def test_a_schedule_name_of_another_project_is_never_replaced(tenants: Tenants) -> None:
    alice = httpx2.Client(base_url=tenants.base, headers=auth(tenants.keys["alice"]), timeout=30)
    before = b_state(tenants)
    taken = alice.post(
        "/schedules",
        json={"recipe": "release", "every": "1h", "name": tenants.b["schedule"], "replace": True},
    )
    assert taken.status_code == 409, taken.text
    assert taken.json()["error"]["type"] == "schedule_exists"
    assert b_state(tenants) == before
    boss = httpx2.Client(base_url=tenants.base, headers=auth(tenants.keys["boss"]), timeout=30)
    assert boss.get(f"/schedules/{tenants.b['schedule']}").json()["every"] == 86400
    made = alice.post("/schedules", json={"recipe": "release", "every": "1h", "name": "a-hourly"})
    assert made.status_code == 201
    assert made.json()["project"] == A


# -- the one place -------------------------------------------------------------------------------


def test_a_route_that_could_reach_another_projects_rows_stops_the_app() -> None:
    from minions.service._access import unscoped

    app = create_app(ServiceConfig(token=TOKEN))
    assert unscoped(app) == []
    router = APIRouter()

    @router.get("/leaky/{run_id}")
    async def leaky(caller: Reader, run_id: str, runs: WholeStore) -> None:
        """Reads any run."""

    @router.get("/forgetful/{run_id}")
    async def forgetful(caller: Reader, run_id: str) -> None:
        """Takes an id, and no scoped store."""

    @router.get("/fine/{run_id}")
    async def fine(caller: Reader, run_id: str, runs: Runs) -> None:
        """Takes the store as its caller sees it."""

    bad = FastAPI()
    bad.include_router(router)
    assert unscoped(bad) == ["GET /leaky/{run_id}", "GET /forgetful/{run_id}"]


async def test_the_scoped_store_keeps_projects_apart(url: str, tmp_path: Path) -> None:
    recipes = write_recipes(tmp_path / "recipes")
    store = RunStore(url, create=True)
    mine, _ = await store.submit(recipes / "flaky.yaml", project=A)
    theirs, _ = await store.submit(recipes / "flaky.yaml", project=B)
    await store.add_schedule(recipes / "approval.yaml", every="1h", name="theirs", project=B)
    seen = store.scoped(Scope.of([A]))
    assert (await seen.get(mine)).project == A
    assert (await seen.step_states(mine)).steps() == {}  # queued: no step told of yet
    for call in (
        seen.get(theirs),
        seen.events(theirs),
        seen.cancel(theirs),
        seen.resume(theirs),
        seen.diff(mine, theirs),
        seen.step_detail(theirs, "first"),
        seen.step_states(theirs),
        # A record read elsewhere (the unscoped store's) names a run the scope does not see.
        seen.step_states(await store.get(theirs)),
        seen.approve(theirs, "x", approved=True),
    ):
        with pytest.raises(UnknownRunError):
            await call
    with pytest.raises(UnknownRunError):
        async for _ in seen.follow(theirs):
            pass
    for schedule_call in (seen.schedule("theirs"), seen.pause_schedule("theirs")):
        with pytest.raises(UnknownScheduleError):
            await schedule_call
    assert [r.run_id for r in await seen.list_runs()] == [mine]
    with pytest.raises(UnknownProjectError):
        await seen.list_runs(project=B)
    assert await seen.count_runs() == 1
    assert await seen.schedules() == []
    with pytest.raises(UnknownProjectError):
        await seen.submit(recipes / "flaky.yaml", project=B)
    assert (await store.get(theirs)).status == "queued"
    every = store.scoped(Scope())
    assert await every.count_runs() == 2
    assert await every.count_runs(project=B) == 1
    await store.aclose()


async def test_a_scope_narrowed_to_one_project_and_the_projects_a_store_knows(
    url: str, tmp_path: Path
) -> None:
    recipes = write_recipes(tmp_path / "recipes")
    store = RunStore(url, create=True)
    assert await store.projects() == []
    mine, _ = await store.submit(recipes / "flaky.yaml", project=A)
    theirs, _ = await store.submit(recipes / "flaky.yaml", project=B)
    await store.submit(recipes / "flaky.yaml", project=B)
    await store.add_schedule(
        recipes / "approval.yaml", every="1h", name="ops-hourly", project="ops"
    )
    await store.add_key("kim", role="viewer", projects=["zeta"])
    assert await store.projects() == ["ops", A, B, "zeta"]
    every = store.scoped(Scope())
    assert [r.run_id for r in await every.within(A).list_runs()] == [mine]
    assert await every.within(B).count_runs() == 2
    assert every.within(None) is every
    assert await every.within("nobodys").list_runs() == []
    assert await every.projects() == ["ops", A, B, "zeta"]
    both = store.scoped(Scope.of([A, B]))
    assert await both.within(B).count_runs() == 2
    assert await both.within(B).get(theirs) is not None
    with pytest.raises(UnknownRunError):  # narrowed, A's run is as unknown as B's to A
        await both.within(B).get(mine)
    assert await both.projects() == [A, B]
    with pytest.raises(UnknownProjectError):
        both.within("ops")
    with pytest.raises(ValueError, match="project"):
        both.within("a/b")
    await store.aclose()


def test_a_store_of_schema_5_gets_projects(tmp_path: Path) -> None:
    """Runs, schedules and evals stored before projects belong to ``default``."""
    import sqlite3

    from runs_helpers import insert_run

    from minions.runs._db import Database
    from minions.runs._tables import SCHEMA_VERSION

    path = tmp_path / "old.db"
    made = Database(f"sqlite:///{path}", create=True)
    insert_run(made, "before")
    made.close()
    with sqlite3.connect(path) as db:
        db.execute("DROP INDEX ix_minions_runs_project")
        for table in ("minions_runs", "minions_schedules", "minions_evals"):
            db.execute(f"ALTER TABLE {table} DROP COLUMN project")
        db.execute("UPDATE minions_meta SET value = '5' WHERE key = 'schema_version'")

    async def read() -> tuple[str, list[str]]:
        store = RunStore(f"sqlite:///{path}")
        record = await store.get("before")
        found = [r.run_id for r in await store.scoped(Scope.of([A])).list_runs()]
        await store.aclose()
        return record.project, found

    assert asyncio.run(read()) == ("default", [])
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM minions_meta").fetchone()[0] == str(SCHEMA_VERSION)


# -- the CLI ---------------------------------------------------------------------------------


def test_the_cli_submits_and_lists_runs_of_a_project(tmp_path: Path) -> None:
    recipes = write_recipes(tmp_path / "recipes")
    runner = CliRunner()
    store = ["--database-url", f"sqlite:///{tmp_path / 'minions.db'}"]
    made = runner.invoke(
        cli, ["submit", str(recipes / "flaky.yaml"), "--project", B, "--json", *store]
    )
    assert made.exit_code == 0, made.output
    run_id = json.loads(made.stdout)["run_id"]
    runner.invoke(cli, ["submit", str(recipes / "flaky.yaml"), *store])
    listed = runner.invoke(cli, ["runs", "list", "--project", B, "--json", *store])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)
    assert [(r["run_id"], r["project"]) for r in rows] == [(run_id, B)]
    added = runner.invoke(
        cli,
        ["schedules", "add", str(recipes / "approval.yaml"), "--every", "1h", "--project", B,
         "--json", *store],
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    assert json.loads(added.stdout)["project"] == B
    for wrong in (
        ["submit", str(recipes / "flaky.yaml"), "--project", "a/b", *store],
        ["schedules", "add", str(recipes / "approval.yaml"), "--every", "1h", "--project", "",
         *store],
        ["eval", str(recipes / "cases.yaml"), "--project", B],  # only with --durable
    ):  # fmt: skip
        refused = runner.invoke(cli, wrong)
        assert refused.exit_code == 2, (wrong, refused.output)
        assert "Traceback" not in refused.output
        assert "project" in refused.output, refused.output


# -- the console -------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_console_of_a_key_of_one_project_never_shows_anothers(tenants: Tenants) -> None:
    """In Chromium, logged in with A's key: the runs, schedules and evals pages list A's rows
    only; B's run, diff, schedule and eval, opened by their addresses, are unknown; nothing
    of B's reaches the page (its HTML is searched for B's ids after each page)."""
    from browser_helpers import launch
    from playwright.sync_api import expect, sync_playwright

    markers = [*tenants.b.values(), B]

    typed: set[str] = set()

    def clean(page: Any, where: str, asked: str = "") -> None:
        """Nothing of B's in the page's HTML but the ids typed in its addresses (`asked`,
        and before it)."""
        typed.add(asked)
        html = page.content()
        for marker in markers:
            if marker not in typed:
                assert marker not in html, (where, marker)

    with sync_playwright() as playwright:
        browser = launch(playwright)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        try:
            page.goto(f"{tenants.base}/")
            page.fill("#token", tenants.keys["alice"])
            page.click("#login button")
            expect(page.locator("#app")).to_be_visible()
            own = page.locator(f'#runs tbody tr[data-run="{tenants.a["failed"]}"]')
            expect(own).to_have_count(1)
            clean(page, "runs")
            a, b = tenants.a, tenants.b
            visits = [  # the address, where the page says what, what it says, an id of B's typed
                (f"#/runs/{a['failed']}", "#run-recipe", f"flaky · project {A}", ""),
                (f"#/runs/{b['failed']}", "#run-recipe", "no run", b["failed"]),
                (f"#/runs/{a['failed']}/diff/{b['failed']}", "body", "no run", b["failed"]),
                ("#/schedules", "body", a["schedule"], ""),
                (f"#/schedules/{b['schedule']}", "#schedule-runs-title", "no schedule", b["schedule"]),
                ("#/evals", "body", a["eval"], ""),
                (f"#/evals/{b['eval']}", "#eval-head", "no eval", b["eval"]),
            ]  # fmt: skip
            for address, where, says, asked in visits:
                page.goto(f"{tenants.base}/{address}")
                expect(page.locator(where)).to_contain_text(says)
                if asked == b["failed"] and where == "#run-recipe":  # nothing of A's run stays
                    expect(page.locator("#run-status")).to_have_text("")
                    expect(page.locator("#run-times")).to_have_text("")
                clean(page, address, asked)
        finally:
            page.close()
            browser.close()


@pytest.mark.slow
def test_the_console_project_picker_narrows_every_listing(tenants: Tenants, tmp_path: Path) -> None:
    """In Chromium: an admin picks project A in the header and sees A's runs only (each
    naming its project), A's schedules and A's waiting call in its count; then B; the pick
    outlives a reload, and a run submitted from the console goes into it. A key of A alone
    sees no picker but its project's name, and nothing of B's, even with B remembered in the
    browser. A screenshot (the runs of A picked) goes to the test's folder (to docs/ with
    ``MINIONS_SCREENSHOTS=docs``)."""
    import os

    from browser_helpers import launch
    from playwright.sync_api import expect, sync_playwright

    shots = DOCS if os.environ.get("MINIONS_SCREENSHOTS") == "docs" else tmp_path
    a, b = tenants.a, tenants.b

    def log_in(page: Any, key: str) -> None:
        page.fill("#token", tenants.keys[key])
        page.click("#login button")
        expect(page.locator("#app")).to_be_visible()

    with sync_playwright() as playwright:
        browser = launch(playwright)
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        try:
            page.goto(f"{tenants.base}/")
            log_in(page, "boss")
            picker = page.locator("#project")
            expect(picker).to_be_visible()
            expect(picker).to_have_value("")  # all projects, at first
            expect(page.locator("#project-name")).to_be_hidden()
            options = picker.locator("option")
            known = httpx2.get(f"{tenants.base}/projects", headers=auth(tenants.keys["boss"]))
            assert {A, B} <= set(known.json())
            expect(options).to_have_text(["all projects", *known.json()])
            expect(page.locator(f'#runs tr[data-run="{b["failed"]}"]')).to_have_count(1)
            expect(page.locator(f'#runs tr[data-run="{a["failed"]}"]')).to_have_count(1)
            expect(page.locator("#waiting")).to_have_text("2 wait for you")
            for project, own, other in ((A, a, b), (B, b, a)):
                picker.select_option(project)
                expect(page.locator(f'#runs tr[data-run="{other["failed"]}"]')).to_have_count(0)
                row = page.locator(f'#runs tr[data-run="{own["failed"]}"]')
                expect(row.locator("td.proj")).to_have_text(project)
                expect(row.locator("td.proj")).to_be_visible()
                expect(page.locator(f'#runs tr[data-run="{own["waiting"]}"]')).to_have_count(1)
                others = page.locator(f'#runs tbody tr[data-run]:not([data-project="{project}"])')
                expect(others).to_have_count(0)
                expect(page.locator("#waiting")).to_have_text("1 waits for you")
                if project == A:
                    page.screenshot(path=str(shots / "console-projects.png"))
                page.click("#nav-schedules")
                expect(page.locator(f'#schedules tr[data-schedule="{own["schedule"]}"]')).to_have_count(1)  # fmt: skip
                expect(page.locator(f'#schedules tr[data-schedule="{other["schedule"]}"]')).to_have_count(0)  # fmt: skip
                expect(page.locator(f'#schedules tbody tr[data-schedule]:not([data-project="{project}"])')).to_have_count(0)  # fmt: skip
                page.click("#nav-runs")
            # The pick is remembered; a run submitted from the console goes into it.
            page.reload()
            expect(picker).to_have_value(B)
            expect(page.locator(f'#runs tr[data-run="{b["failed"]}"]')).to_have_count(1)
            expect(page.locator(f'#runs tr[data-run="{a["failed"]}"]')).to_have_count(0)
            page.click("details.new-run summary")
            expect(page.locator("#submit-project")).to_have_value(B)
            page.select_option("#recipe", "flaky")
            page.click("#submit")
            expect(page.locator("#run-recipe")).to_have_text(f"flaky · project {B}")
            # Back to all projects.
            page.click("a.back")
            picker.select_option("")
            expect(page.locator(f'#runs tr[data-run="{a["failed"]}"]')).to_have_count(1)
            expect(page.locator("#waiting")).to_have_text("2 wait for you")
        finally:
            page.close()
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        asked: list[str] = []
        page.on("request", lambda request: asked.append(request.url))
        try:
            page.goto(f"{tenants.base}/")
            page.evaluate(f"localStorage.setItem('minions-project', '{B}')")
            log_in(page, "alice")
            expect(page.locator(f'#runs tr[data-run="{a["failed"]}"]')).to_have_count(1)
            expect(page.locator("#picker")).to_be_hidden()
            expect(page.locator("#project-name")).to_have_text(A)
            expect(page.locator("#runs thead th.proj")).to_be_hidden()
            expect(page.locator("#submit-project-label")).to_be_hidden()
            expect(page.locator("#waiting")).to_have_text("1 waits for you")
            expect(page.locator("#connection")).to_have_text("")
            html = page.content()
            for marker in [*b.values(), B]:
                assert marker not in html, marker
            assert not [url for url in asked if B in url]
        finally:
            page.close()
            browser.close()


# -- recipes folders per project -----------------------------------------------------------------

TRIAGE = "id: triage\ndescription: Team A's own.\nsteps:\n  - id: hi\n    goal: Say hi.\n"


def test_a_project_with_its_own_recipes_folder_is_offered_its_recipes_only(
    tmp_path: Path,
) -> None:
    shared = write_recipes(tmp_path / "recipes")
    own = tmp_path / "team-a-recipes"
    own.mkdir()
    (own / "triage.yaml").write_text(TRIAGE)
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"

    async def keys() -> dict[str, str]:
        store = RunStore(url, create=True)
        made = {
            "alice": (await store.add_key("alice", role="operator", projects=[A])).key,
            "bob": (await store.add_key("bob", role="operator", projects=[B])).key,
            "multi": (await store.add_key("multi", role="operator", projects=[A, B])).key,
        }
        await store.aclose()
        return made

    made = asyncio.run(keys())
    config = ServiceConfig(token=TOKEN, database_url=url, recipes=shared, project_recipes={A: own})
    with app_in_thread(create_app(config)) as base:

        def client(name: str) -> httpx2.Client:
            return httpx2.Client(base_url=base, headers=auth(made[name]), timeout=30)

        def offered(name: str, **query: str) -> list[str]:
            return sorted(r["id"] for r in client(name).get("/recipes", params=query).json())

        assert offered("alice") == ["triage"]
        assert "triage" not in offered("bob")
        assert "flaky" in offered("bob")
        assert offered("multi", project=A) == ["triage"]
        assert "flaky" in offered("multi")  # several projects, none named: the server's
        assert client("multi").get("/recipes", params={"project": "zz"}).status_code == 404
        assert client("bob").get("/recipes", params={"project": A}).status_code == 404
        assert client("alice").post("/runs", json={"recipe": "triage"}).status_code == 201
        refused = client("alice").post("/runs", json={"recipe": "flaky"})
        assert refused.status_code == 400
        assert refused.json()["error"]["type"] == "unknown_recipe"
        assert "flaky" not in refused.json()["error"]["message"].split("known:")[1]
        assert client("bob").post("/runs", json={"recipe": "triage"}).status_code == 400
        assert client("bob").post("/runs", json={"recipe": "flaky"}).status_code == 201


def test_a_workers_run_of_a_project_with_its_own_root_is_found_there(tmp_path: Path) -> None:
    from minions.recipes._folder import RecipeFolder
    from minions.runs import RunRecord
    from minions.runs._leases import Lease, Start
    from minions.runs._runner import RunExecutor
    from minions.runs._snapshot import RecipeSnapshot

    shared = write_recipes(tmp_path / "recipes")
    own = tmp_path / "team-a-recipes"
    own.mkdir()
    (own / "flaky.yaml").write_text((shared / "flaky.yaml").read_text())
    runner = RunExecutor(
        None,  # type: ignore[arg-type]  # finding a recipe file reads no store
        executor_id="w",
        incarnation="i",
        recipes=RecipeFolder(shared),
        project_recipes={A: RecipeFolder(own)},
    )

    def start(project: str) -> Start:
        return Start(
            lease=Lease(run_id="r", holder="i", epoch=1, attempt=1),
            record=RunRecord(
                run_id="r", recipe_id="flaky", status="running", created_at=0.0, project=project
            ),
            snapshot=RecipeSnapshot(
                recipe_id="flaky", yaml="", path="/elsewhere/flaky.yaml", hash="-", request_hash="-"
            ),
            last_seq=0,
        )

    assert runner.recipe_file(start(A)) == str((own / "flaky.yaml").resolve())
    assert runner.recipe_file(start(B)) == str((shared / "flaky.yaml").resolve())


def test_project_recipes_options_are_checked(tmp_path: Path) -> None:
    runner = CliRunner()
    for wrong, says in (
        (["--project-recipes", "team-a"], "PROJECT=DIR"),
        (["--project-recipes", f"a/b={tmp_path}"], "project"),
        (["--project-recipes", f"a={tmp_path / 'none'}"], "no such folder"),
        (["--project-recipes", f"a={tmp_path}", "--project-recipes", f"a={tmp_path}"], "twice"),
    ):
        for command in ("worker", "serve"):
            refused = runner.invoke(cli, [command, *wrong])
            assert refused.exit_code == 2, (command, wrong, refused.output)
            assert says in refused.output, refused.output
