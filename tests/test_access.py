"""Named API keys with roles, and actors: the keys' store (SQLite and Postgres: hashes only,
names reused after a revoke), `minions keys`, the role matrix generated from the app's own
routes (every route x every role: allowed, or 403; a route that declares no permission fails
it), stream tickets that carry their key (a revoked key's ticket and open stream end at once),
hostile credentials (401s, never a 500), and who did what, in `GET /runs/{id}` and in the
run's events, through a real `minions serve` whose log never shows a key."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx2
import pytest
import sqlalchemy as sa
from fastapi import APIRouter
from fastapi.routing import APIRoute
from service_helpers import TOKEN, app_in_thread, auth, server, write_recipes
from typer.testing import CliRunner

from minions.cli import app as cli
from minions.errors import KeyExistsError, UnknownKeyError
from minions.runs import ROLES, RunStore
from minions.service import ServiceConfig, create_app

# -- the store ------------------------------------------------------------------------------


async def test_keys_are_stored_as_hashes_and_names_come_back_after_a_revoke(url: str) -> None:
    store = RunStore(url, create=True)
    made = await store.add_key("alice", role="approver", projects=["a", "b"], actor="x")
    record, key = made.record, made.key
    assert key.startswith("mk_")
    assert len(key) == 46
    assert (record.name, record.role, record.projects, record.created_by) == (
        "alice",
        "approver",
        ("a", "b"),
        "x",
    )
    assert await store.key_of(key) == record
    assert await store.key_of(key[:-1] + ("A" if key[-1] != "A" else "B")) is None
    assert await store.key_of("not a key") is None
    # Only the SHA-256 is kept: the key is in no column of any row.
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as db:
        rows = [dict(r._mapping) for r in db.execute(sa.text("SELECT * FROM minions_keys"))]
    engine.dispose()
    assert [r["hash"] for r in rows] == [hashlib.sha256(key.encode()).hexdigest()]
    assert key not in json.dumps(rows, default=str)
    with pytest.raises(KeyExistsError):
        await store.add_key("alice", role="admin")
    for name, role, projects in [
        ("Alice", "viewer", []),
        ("token", "viewer", []),
        ("a b", "viewer", []),
        ("bob", "root", []),
        ("bob", "viewer", ["no/slash"]),
    ]:
        with pytest.raises(ValueError):
            await store.add_key(name, role=role, projects=projects)
    revoked = await store.revoke_key("alice", actor="y")
    assert revoked.revoked_by == "y"
    assert revoked.revoked_at is not None
    assert await store.key_of(key) is None
    assert await store.key_by_id(record.id) is None
    with pytest.raises(UnknownKeyError):
        await store.revoke_key("alice")
    again = await store.add_key("alice", role="viewer")
    assert again.record.id != record.id
    assert again.key != key
    assert [k.name for k in await store.keys()] == ["alice"]
    assert [k.role for k in await store.keys(revoked=True)] == ["approver", "viewer"]
    await store.aclose()


def test_minions_keys_adds_lists_and_revokes(tmp_path: Path) -> None:
    runner = CliRunner()
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    store = ["--database-url", url]
    added = runner.invoke(cli, ["keys", "add", "ci", "--role", "operator", "--project", "web",
                                "--project", "api", "--json", *store])  # fmt: skip
    assert added.exit_code == 0, added.output
    data = json.loads(added.stdout)
    assert list(data) == ["name", "key", "role", "projects"]
    assert (data["name"], data["role"], data["projects"]) == ("ci", "operator", ["web", "api"])
    plain = runner.invoke(cli, ["keys", "add", "viv", "--role", "viewer", *store])
    assert plain.exit_code == 0
    assert plain.stdout.strip().startswith("mk_")
    assert "shown this once" in plain.stderr
    listed = runner.invoke(cli, ["keys", "list", "--json", *store])
    rows = json.loads(listed.stdout)
    assert [(r["name"], r["role"], r["projects"]) for r in rows] == [
        ("ci", "operator", ["web", "api"]),
        ("viv", "viewer", ["default"]),
    ]
    assert all(r["created_by"].startswith("cli") for r in rows)
    assert data["key"] not in listed.stdout
    table = runner.invoke(cli, ["keys", "list", *store])
    assert "web,api" in table.stdout
    assert data["key"] not in table.stdout
    assert runner.invoke(cli, ["keys", "revoke", "ci", *store]).exit_code == 0
    assert [r["name"] for r in json.loads(runner.invoke(cli, ["keys", "list", "--json", *store]).stdout)] == ["viv"]  # fmt: skip
    for wrong in (
        ["keys", "add", "x", "--role", "boss", *store],
        ["keys", "add", "X", "--role", "admin", *store],
        ["keys", "add", "viv", "--role", "admin", *store],
        ["keys", "add", "y", *store],
        ["keys", "revoke", "ci", *store],
        ["keys", "list", "--database-url", f"sqlite:///{tmp_path / 'none.db'}"],
    ):
        refused = runner.invoke(cli, wrong)
        assert refused.exit_code == 2, (wrong, refused.output)
        assert "Traceback" not in refused.output


# -- the role matrix ------------------------------------------------------------------------

PERMISSIONS = {
    "GET /runs": "read",
    "POST /runs": "operate",
    "GET /runs/{run_id}": "read",
    "POST /runs/{run_id}/cancel": "operate",
    "POST /runs/{run_id}/resume": "operate",
    "POST /runs/{run_id}/approvals/{call_id:path}": "approve",
    "POST /runs/{run_id}/rerun": "operate",
    "POST /runs/{run_id}/rerun/preview": "operate",
    "GET /runs/{run_a}/diff/{run_b}": "read",
    "GET /runs/{run_id}/events": "read",
    "GET /runs/{run_id}/events/stream": "read",
    "POST /runs/{run_id}/events/ticket": "read",
    "GET /runs/{run_id}/steps": "read",
    "GET /runs/{run_id}/steps/{step_id}": "read",
    "GET /recipes": "read",
    "GET /workers": "read",
    "GET /endpoints/status": "read",
    "GET /queue": "read",
    "GET /notifications": "read",
    "GET /usage": "read",
    "GET /health": "public",
    "GET /health/live": "public",
    "GET /health/ready": "public",
    "POST /schedules": "operate",
    "GET /schedules": "read",
    "GET /schedules/{name}": "read",
    "DELETE /schedules/{name}": "operate",
    "POST /schedules/{name}/pause": "operate",
    "POST /schedules/{name}/resume": "operate",
    "GET /evals": "read",
    "GET /evals/{eval_id}": "read",
    "GET /keys": "admin",
    "POST /keys": "admin",
    "DELETE /keys/{name}": "admin",
    "GET /me": "read",
    "GET /projects": "read",
    "GET /audit": "admin",
    "GET /": "public",
    "GET /console/{name}": "public",
}
"""What each route needs, as the contract says (docs/access.md): a new route fails the matrix
until it is here."""
LEAST = {"public": None, "read": "viewer", "approve": "approver", "operate": "operator"}


def allowed(permission: str, role: str) -> bool:
    least = LEAST.get(permission, "admin")
    order: list[str] = list(ROLES)
    return least is None or order.index(role) >= order.index(least)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """An API (no worker) with a key of each role, and their keys by role."""
    folder = tmp_path_factory.mktemp("access")
    url = f"sqlite:///{folder / 'store' / 'minions.db'}"

    async def keys() -> dict[str, str]:
        store = RunStore(url, create=True)
        made: dict[str, str] = {}
        for role in ROLES:
            made[role] = (await store.add_key(f"k-{role}", role=role)).key
        await store.aclose()
        return made

    made = asyncio.run(keys())
    config = ServiceConfig(
        token=TOKEN, database_url=url, recipes=write_recipes(folder / "recipes"), heartbeat=0.05
    )
    with app_in_thread(create_app(config)) as base:
        yield base, made


def routes() -> list[tuple[str, str]]:
    """Every method and path the app serves, from its routes."""
    from fastapi.routing import iter_route_contexts

    from minions.service._access import api_routes

    app = create_app(ServiceConfig(token=TOKEN))
    others = [
        c.path
        for c in iter_route_contexts(app.routes)
        if not isinstance(c.original_route, APIRoute)
    ]
    assert others == ["/openapi.json"]  # FastAPI's own schema: any key reads it
    return [(method, path) for method, path, _ in api_routes(app)]


def test_every_route_declares_the_permission_the_contract_says() -> None:
    from minions.service._access import api_routes, permission_of

    app = create_app(ServiceConfig(token=TOKEN))
    declared = {f"{m} {path}": permission_of(route) for m, path, route in api_routes(app)}
    assert declared == PERMISSIONS
    # And every route that takes an id, but admins' and public ones, takes the store as its
    # caller's projects let it see it (docs/access.md#projects; tests/test_projects.py).
    from minions.service._access import scoped, unscoped

    assert unscoped(app) == []
    for method, path, route in api_routes(app):
        if "{" in path and PERMISSIONS[f"{method} {path}"] not in ("admin", "public"):
            assert scoped(route), f"{method} {path}"


@pytest.mark.parametrize("public", [False, True])
def test_metrics_need_a_reader_unless_public(tmp_path: Path, public: bool) -> None:
    """``/metrics`` (``serve --metrics``) declares `Scraper`: a key of any role reads it; without
    a key it is a 401, unless the server makes it public."""
    from minions.service._access import api_routes, permission_of

    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"

    async def viewer() -> str:
        store = RunStore(url, create=True)
        key = (await store.add_key("vic", role="viewer")).key
        await store.aclose()
        return key

    key = asyncio.run(viewer())
    config = ServiceConfig(token=TOKEN, database_url=url, metrics=True, metrics_public=public)
    app = create_app(config)
    declared = {f"{m} {path}": permission_of(route) for m, path, route in api_routes(app)}
    assert declared["GET /metrics"] == "read"
    with app_in_thread(app) as base:
        assert httpx2.get(f"{base}/metrics", headers=auth(key), timeout=60).status_code == 200
        stranger = httpx2.get(f"{base}/metrics", timeout=60)
        assert stranger.status_code == (200 if public else 401), stranger.text


def test_a_route_without_a_permission_is_found_and_refused() -> None:
    from minions.service import _app
    from minions.service._access import undeclared
    from minions.service._routes import info

    app = create_app(ServiceConfig(token=TOKEN))
    forgot = APIRouter()

    @forgot.get("/forgotten")
    async def forgotten() -> dict[str, str]:
        return {}

    app.include_router(forgot)
    assert undeclared(app) == ["GET /forgotten"]
    # The app itself refuses to start with one.
    info.router.routes.append(forgot.routes[0])
    try:
        with pytest.raises(RuntimeError, match="GET /forgotten"):
            _app.create_app(ServiceConfig(token=TOKEN))
    finally:
        info.router.routes.remove(forgot.routes[0])


@pytest.mark.parametrize("role", ROLES)
def test_the_role_matrix(served: tuple[str, dict[str, str]], role: str) -> None:
    """Every route of the app, as each role: allowed (any answer but 401/403, never a 5xx),
    or 403 naming the role it needs; nothing changes for the refused."""
    base, keys = served
    with httpx2.Client(base_url=base, headers=auth(keys[role]), timeout=60) as client:
        for method, path in routes():
            permission = PERMISSIONS[f"{method} {path}"]
            target = path.replace("{name}", "nope").replace("{call_id:path}", "c")
            for name in ("{run_id}", "{run_a}", "{run_b}", "{step_id}", "{eval_id}"):
                target = target.replace(name, "x")
            body: dict[str, Any] | None = {} if method == "POST" else None
            answer = client.request(method, target, json=body)
            assert answer.status_code < 500, (method, path, answer.text)
            if allowed(permission, role):
                assert answer.status_code not in (401, 403), (role, method, path, answer.text)
            else:
                assert answer.status_code == 403, (role, method, path, answer.text)
                error = answer.json()["error"]
                assert error["type"] == "forbidden"
                assert f"'k-{role}' is {role}" in error["message"]
        openapi = client.get("/openapi.json")
        assert openapi.status_code == 200
    # The refused changed nothing: no key was added by a viewer.
    with httpx2.Client(base_url=base, headers=auth(), timeout=60) as admin:
        names = [k["name"] for k in admin.get("/keys").json()]
    assert names == [f"k-{r}" for r in sorted(ROLES)]


def test_keys_over_rest_for_admins(served: tuple[str, dict[str, str]]) -> None:
    base, keys = served
    with httpx2.Client(base_url=base, headers=auth(keys["admin"]), timeout=60) as client:
        made = client.post("/keys", json={"name": "rita", "role": "viewer", "projects": ["p"]})
        assert made.status_code == 201, made.text
        data = made.json()
        assert list(data) == ["name", "key", "role", "projects"]
        listed = client.get("/keys").json()
        rita = next(k for k in listed if k["name"] == "rita")
        assert rita["created_by"] == "k-admin"
        assert "key" not in rita
        assert data["key"] not in json.dumps(listed)
        assert httpx2.get(base + "/runs", headers=auth(data["key"])).status_code == 200
        again = client.post("/keys", json={"name": "rita", "role": "admin"})
        assert (again.status_code, again.json()["error"]["type"]) == (409, "key_exists")
        for bad in (
            {"name": "Rita", "role": "viewer"},
            {"name": "token", "role": "viewer"},
            {"name": "x", "role": "viewer", "projects": ["a/b"]},
        ):
            refused = client.post("/keys", json=bad)
            assert refused.status_code == 400, (bad, refused.text)
        for bad in ({"name": "x", "role": "boss"}, {"name": "x"}, {"name": "x" * 65, "role": "admin"}):  # fmt: skip
            assert client.post("/keys", json=bad).status_code == 422, bad
        assert client.delete("/keys/rita").status_code == 204
        gone = httpx2.get(base + "/runs", headers=auth(data["key"]))
        assert gone.status_code == 401
        assert gone.json()["error"]["message"] == "the bearer key is wrong or was revoked"
        unknown = client.delete("/keys/rita")
        assert (unknown.status_code, unknown.json()["error"]["type"]) == (404, "unknown_key")


@pytest.mark.parametrize(
    "header",
    [
        b"Bearer mk_" + b"\xff" * 43,
        b"Bearer mk_" + b"a" * 5000,
        b"Bearer mk_",
        b"Bearer ",
        b"bearer mk_x mk_y",
        b"Basic dXNlcjpwYXNz",
        b"mk_aaaa",
        b"Bearer \x00\x01",
    ],
)
def test_hostile_credentials_are_401s(served: tuple[str, dict[str, str]], header: bytes) -> None:
    from service_helpers import raw_request

    base, _ = served
    port = int(base.rsplit(":", 1)[1])
    status, body = raw_request(port, "GET", "/runs", {"Authorization": header}, token=None)
    assert status in (400, 401), body
    assert b"Traceback" not in body


# -- stream tickets -------------------------------------------------------------------------


def test_a_ticket_carries_its_key_and_a_revoked_key_ends_its_streams(
    served: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """A viewer's ticket opens a run's stream as that viewer; once the key is revoked, the
    open stream ends with a `revoked` message and the ticket opens nothing; the token's
    stream goes on."""
    base, _keys = served
    with httpx2.Client(base_url=base, headers=auth(), timeout=60) as admin:
        submitted = admin.post("/runs", json={"recipe": "ledger", "inputs": {"tag": "t"}})
        assert submitted.status_code == 201, submitted.text
        run_id = submitted.json()["run_id"]  # no worker: it stays queued, its stream open
        made = admin.post("/keys", json={"name": "watcher", "role": "viewer"}).json()
        ticket = httpx2.post(
            f"{base}/runs/{run_id}/events/ticket", headers=auth(made["key"])
        ).json()["ticket"]
        assert ticket.split(".")[1] != "token"
        stream = f"{base}/runs/{run_id}/events/stream"
        with (
            httpx2.stream("GET", stream, params={"ticket": ticket}, timeout=60) as by_ticket,
            httpx2.stream("GET", stream, headers=auth(made["key"]), timeout=60) as by_header,
            httpx2.stream("GET", stream, headers=auth(), timeout=60) as by_token,
        ):
            assert by_ticket.status_code == by_header.status_code == 200
            lines = by_token.iter_lines()
            assert admin.delete("/keys/watcher").status_code == 204
            for response in (by_ticket, by_header):
                last = _last_message(response)  # the stream ends: the key was revoked
                assert last["event"] == "revoked"
                assert "'watcher' was revoked" in last["data"]["error"]["message"]
            # The token's stream is still open: it beats on.
            assert next(line for line in lines if line.startswith(":")) == ": keep-alive"
        again = httpx2.get(stream, params={"ticket": ticket}, timeout=60)
        assert again.status_code == 401
        assert "revoked" in again.json()["error"]["message"]
        token_ticket = admin.post(f"/runs/{run_id}/events/ticket").json()["ticket"]
        assert token_ticket.split(".")[1] == "token"


def _last_message(response: httpx2.Response, beats: int = 400) -> dict[str, Any]:
    """The stream's last message, once it ends; fails (instead of waiting for ever) when
    it goes on beating `beats` times."""
    last: dict[str, Any] = {}
    current: dict[str, Any] = {}
    for line in response.iter_lines():
        if line.startswith(":"):
            beats -= 1
            assert beats > 0, "the stream went on"
        elif line == "":
            if "data" in current:
                last = {**current, "data": json.loads(current["data"])}
            current = {}
        else:
            name, _, value = line.partition(":")
            current[name] = value.removeprefix(" ")
    return last


# -- actors, through a real server ----------------------------------------------------------


def _until(client: httpx2.Client, run_id: str, status: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while True:
        body: dict[str, Any] = client.get(f"/runs/{run_id}").json()
        if body["status"] == status:
            return body
        assert body["status"] not in ("completed", "failed", "cancelled"), body
        assert time.monotonic() < deadline, body
        time.sleep(0.05)


def _events(client: httpx2.Client, run_id: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = client.get(f"/runs/{run_id}/events").json()
    return found


@pytest.mark.slow
def test_who_did_what_is_in_the_run_and_its_events_and_keys_never_in_the_log(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    recipes = write_recipes(tmp_path / "recipes")

    async def keys() -> dict[str, str]:
        store = RunStore(url, create=True)
        made = {
            name: (await store.add_key(name, role=role)).key
            for name, role in (("olga", "operator"), ("alice", "approver"), ("vic", "viewer"))
        }
        await store.aclose()
        return made

    made = asyncio.run(keys())
    with server(tmp_path, url, "--recipes", str(recipes), LEDGER=str(tmp_path / "l.txt"),
                FLAKY_OK=str(tmp_path / "ok")) as process:  # fmt: skip
        olga = httpx2.Client(base_url=process.base, headers=auth(made["olga"]), timeout=60)
        alice = httpx2.Client(base_url=process.base, headers=auth(made["alice"]), timeout=60)
        token = httpx2.Client(base_url=process.base, headers=auth(), timeout=60)
        run_id = olga.post("/runs", json={"recipe": "release"}).json()["run_id"]
        call = _until(olga, run_id, "waiting")["approvals"][0]["call_id"]
        refused = httpx2.post(
            f"{process.base}/runs/{run_id}/approvals/{quote(call)}",
            headers=auth(made["vic"]),
            json={"approve": True},
        )
        assert refused.status_code == 403
        decided = alice.post(f"/runs/{run_id}/approvals/{quote(call)}", json={"approve": True})
        assert decided.status_code == 200, decided.text
        run = _until(olga, run_id, "completed")
        assert [a["decided_by"] for a in run["approvals"]] == ["alice"]
        # The run waited parked: alice's decision queued its last attempt.
        assert run["queued_by"] == "alice"
        events = _events(olga, run_id)
        assert [e["actor"] for e in events if e["kind"] == "run_started"] == ["olga"]
        assert [e["actor"] for e in events if e["kind"] == "approval_resolved"] == ["alice"]
        # Cancelled by the token, resumed by olga, rejected by alice.
        second = olga.post("/runs", json={"recipe": "release"}).json()["run_id"]
        _until(olga, second, "waiting")
        cancelled = token.post(f"/runs/{second}/cancel")
        assert cancelled.json()["cancelled_by"] == "token"
        _until(olga, second, "cancelled")
        assert olga.post(f"/runs/{second}/resume").status_code == 200
        call = _until(olga, second, "waiting")["approvals"][0]["call_id"]
        alice.post(
            f"/runs/{second}/approvals/{quote(call)}", json={"approve": False, "reason": "no"}
        )
        _until(olga, second, "failed")  # a rejected tool step fails
        events = _events(olga, second)
        assert [e["actor"] for e in events if e["kind"] == "run_started"] == ["olga"]
        # Resumed by olga (attempt 2 waited parked, then was cancelled), and again by alice's
        # decision (attempt 3 waited parked).
        assert [(e["attempt"], e["actor"]) for e in events if e["kind"] == "run_resumed"] == [
            (3, "olga"),
            (4, "alice"),
        ]
        failed = [(e["error"], e["actor"]) for e in events if e["kind"] == "run_failed"]
        assert failed[0] == ("cancelled", "token")  # parked: ended at once, unheld
        assert failed[1][1] is None  # failed by itself
        assert [e["actor"] for e in events if e["kind"] == "approval_resolved"] == ["alice"]
        # A schedule's change says who made it.
        added = olga.post(
            "/schedules", json={"recipe": "ledger", "every": "1h", "inputs": {"tag": "s"}}
        )
        assert added.status_code == 201, added.text
        assert added.json()["changed_by"] == "olga"
        paused = token.post("/schedules/ledger/pause").json()
        assert paused["changed_by"] == "token"
        # Wrong and revoked keys, and tickets, go by: none of it reaches the log.
        httpx2.get(f"{process.base}/runs", headers=auth(made["vic"] + "x"))
        ticket = olga.post(f"/runs/{run_id}/events/ticket").json()["ticket"]
        httpx2.get(f"{process.base}/runs/{run_id}/events/stream", params={"ticket": ticket})
        asyncio.run(_revoke(url, "vic"))
        assert httpx2.get(f"{process.base}/runs", headers=auth(made["vic"])).status_code == 401
        for client in (olga, alice, token):
            client.close()
        process.stop()
        logged = process.log.read_text() + process.out.read_text()
    for key in made.values():
        assert key not in logged
        assert key[3:] not in logged


async def _revoke(url: str, name: str) -> None:
    store = RunStore(url)
    await store.revoke_key(name, actor="cli:test")
    await store.aclose()


def test_cli_actions_are_recorded_as_cli_and_the_user(tmp_path: Path) -> None:
    """What `minions` does on a store by itself is recorded as ``cli:USER``."""
    from minions.cli._common import cli_actor

    actor = cli_actor()
    assert actor == "cli" or actor.startswith("cli:")
    recipes = write_recipes(tmp_path / "recipes")
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    runner = CliRunner()
    submitted = runner.invoke(
        cli, ["submit", str(recipes / "recipe.yaml"), "-i", "tag=a", "--database-url", url]
    )
    assert submitted.exit_code == 0, submitted.output
    run_id = submitted.stdout.strip()
    cancelled = runner.invoke(cli, ["runs", "cancel", run_id, "--database-url", url])
    assert cancelled.exit_code == 0, cancelled.output

    async def read() -> tuple[str | None, str | None, list[Any]]:
        store = RunStore(url)
        record = await store.get(run_id)
        events = await store.events(run_id)
        await store.aclose()
        return record.queued_by, record.cancelled_by, events

    queued_by, cancelled_by, events = asyncio.run(read())
    assert queued_by == actor
    assert cancelled_by == actor
    assert [(e.kind, getattr(e, "actor", None)) for e in events] == [("run_failed", actor)]


@pytest.mark.parametrize("version", [3, 4])
def test_an_older_store_gets_its_actors_columns(tmp_path: Path, version: int) -> None:
    """An older store (no actors; at 3, no step cache entry's run either) migrates when
    opened, through every version between: its runs read with no actor."""
    import sqlite3

    from runs_helpers import insert_run

    from minions.runs._db import Database
    from minions.runs._tables import SCHEMA_VERSION

    path = tmp_path / "old.db"
    made = Database(f"sqlite:///{path}", create=True)
    insert_run(made, "before")
    made.close()
    with sqlite3.connect(path) as db:  # what schema 4 had
        for table, column in (
            ("minions_runs", "queued_by"),
            ("minions_runs", "cancelled_by"),
            ("minions_approvals", "decided_by"),
            ("minions_schedules", "changed_by"),
        ):
            db.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        db.execute("DROP INDEX ix_minions_runs_project")  # and no projects (schema 6)
        for table in ("minions_runs", "minions_schedules", "minions_evals"):
            db.execute(f"ALTER TABLE {table} DROP COLUMN project")
        if version == 3:  # and what schema 3 had: a step cache entry had no run
            for column in ("run_id", "recipe_id"):
                db.execute(f"DROP INDEX ix_minions_step_cache_{column}")
                db.execute(f"ALTER TABLE minions_step_cache DROP COLUMN {column}")
        db.execute(f"UPDATE minions_meta SET value = '{version}' WHERE key = 'schema_version'")

    async def read() -> tuple[str | None, str | None]:
        store = RunStore(f"sqlite:///{path}")
        record = await store.get("before")
        await store.cancel("before", actor="ann")
        cancelled = await store.get("before")
        await store.aclose()
        return record.queued_by, cancelled.cancelled_by

    assert asyncio.run(read()) == (None, "ann")
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM minions_meta").fetchone()[0] == str(SCHEMA_VERSION)
        cache = {row[1] for row in db.execute("PRAGMA table_info(minions_step_cache)")}
    assert {"run_id", "recipe_id"} <= cache


async def test_reading_keys_never_makes_their_table(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "m.db"
    store = RunStore(f"sqlite:///{path}", create=True)
    assert await store.keys() == []
    assert await store.key_of("mk_" + "a" * 43) is None
    assert await store.key_by_id("0123") is None
    with pytest.raises(UnknownKeyError):
        await store.revoke_key("nobody")
    with sqlite3.connect(path) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    assert "minions_keys" not in tables
    await store.add_key("ann", role="viewer")
    assert [k.name for k in await store.keys()] == ["ann"]
    await store.aclose()


# -- a trusted proxy's user header ------------------------------------------------------------


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """An API that trusts X-Forwarded-User from 127.0.0.1 (the tests' address), and the URL
    of its store; `pat` is an operator there, `vi` a viewer."""
    folder = tmp_path_factory.mktemp("proxied")
    url = f"sqlite:///{folder / 'store' / 'minions.db'}"

    async def keys() -> None:
        store = RunStore(url, create=True)
        await store.add_key("pat", role="operator")
        await store.add_key("vi", role="viewer")
        await store.aclose()

    asyncio.run(keys())
    config = ServiceConfig(
        token=TOKEN,
        database_url=url,
        recipes=write_recipes(folder / "recipes"),
        proxy_user_header="X-Forwarded-User",
        trusted_proxies=("127.0.0.1", "::1/128"),
    )
    with app_in_thread(create_app(config)) as base:
        yield base, url


def test_a_trusted_proxys_user_acts_as_the_key_of_that_name(
    proxied: tuple[str, str],
) -> None:
    base, url = proxied

    def as_user(name: bytes) -> dict[bytes, bytes]:
        return {b"X-Forwarded-User": name}

    assert httpx2.get(f"{base}/runs", headers=as_user(b"vi")).status_code == 200
    refused = httpx2.post(f"{base}/schedules", headers=as_user(b"vi"), json={})
    assert refused.status_code == 403
    assert "'vi' is viewer" in refused.json()["error"]["message"]
    body = {"recipe": "ledger", "every": "1h", "inputs": {"tag": "p"}}
    added = httpx2.post(f"{base}/schedules", headers=as_user(b"pat"), json=body)
    assert added.status_code == 201, added.text
    assert added.json()["changed_by"] == "pat"
    for stranger in (b"nobody", b"PAT", b"\xff\xfe", b"pat pat"):
        answer = httpx2.get(f"{base}/runs", headers=as_user(stranger))
        assert answer.status_code == 401, stranger
        assert "has no key here" in answer.json()["error"]["message"]
    # Without the header, keys and the token work as anywhere.
    assert httpx2.get(f"{base}/runs", headers=auth()).status_code == 200
    assert httpx2.get(f"{base}/runs").status_code == 401
    asyncio.run(_revoke(url, "vi"))
    assert httpx2.get(f"{base}/runs", headers=as_user(b"vi")).status_code == 401


def test_the_header_of_an_untrusted_address_is_ignored(tmp_path: Path) -> None:
    config = ServiceConfig(
        token=TOKEN,
        database_url=f"sqlite:///{tmp_path / 'store' / 'minions.db'}",
        proxy_user_header="X-Forwarded-User",
        trusted_proxies=("10.9.9.9",),
    )
    with app_in_thread(create_app(config)) as base:
        answer = httpx2.get(f"{base}/runs", headers={"X-Forwarded-User": "pat"})
        assert answer.status_code == 401
        assert "Authorization" in answer.json()["error"]["message"]


def test_a_proxy_header_needs_the_proxys_address(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs the proxy's address"):
        create_app(ServiceConfig(token=TOKEN, proxy_user_header="X-Forwarded-User"))
    with pytest.raises(ValueError, match=r"trusted proxy 'proxy\.example'"):
        create_app(
            ServiceConfig(
                token=TOKEN, proxy_user_header="X-User", trusted_proxies=("proxy.example",)
            )
        )
    runner = CliRunner()
    store = ["--database-url", f"sqlite:///{tmp_path / 'm.db'}"]
    for wrong, says in (
        (["--trust-proxy-header", "X-Forwarded-User"], "--trusted-proxy ADDR"),
        (["--trust-proxy-header", "X-User", "--trusted-proxy", "nope"], "--trusted-proxy"),
        (["--trust-proxy-header", "X User", "--trusted-proxy", "127.0.0.1"], "header name"),
        (["--trusted-proxy", "127.0.0.1"], "--trust-proxy-header"),
    ):
        refused = runner.invoke(cli, ["serve", *wrong, *store])
        assert refused.exit_code == 2, (wrong, refused.output)
        assert says in refused.output
