"""Notifications (``--notify``): a receiver on 127.0.0.1 gets a run failed, a run waiting for
approval, a run stuck and a schedule late, each once, signed with the secret, after it was
down (retried from the store's outbox with backoff); the fleet view says how delivery went."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from runs_helpers import insert_run, until, write_ledger_recipe
from service_helpers import free_port
from typer.testing import CliRunner

from minions.cli import app
from minions.events import (
    ApprovalRequested,
    Event,
    ModelCallWaiting,
    RunStarted,
    RunTakenOver,
    StepStarted,
    ToolCallStarted,
)
from minions.models import EndpointLimit, Limits, LocalLimiter
from minions.recipes._schema import CatchUp, Overlap
from minions.runs import Notifier, NotifyTarget, RunStore
from minions.runs._db import Database
from minions.runs._events import EventRow, row_of
from minions.runs._events import insert as insert_events
from minions.runs._notify import SIGNATURE, deliveries
from minions.runs._schedules import Scheduler, Timing
from minions.runs._tables import SCHEMA_VERSION, meta_table
from minions.testing import FakeOpenAIServer, FakeReply

SECRET = "s3cret-shared-with-the-receiver"
LATE = NotifyTarget.parse("late=http://127.0.0.1:9/late")
STUCK = NotifyTarget.parse("stuck=http://127.0.0.1:9/stuck")


class Receiver:
    """An HTTP server that keeps what is POSTed to it."""

    def __init__(self, port: int) -> None:
        self.got: list[tuple[dict[str, str], bytes]] = []
        got = self.got

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                got.append((dict(self.headers), body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @contextmanager
    def up(self) -> Iterator[Receiver]:
        self.thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()


def verified(headers: dict[str, str], body: bytes) -> dict[str, Any]:
    """The body, once its signature is checked as a receiver checks it."""
    parts = dict(p.split("=", 1) for p in headers[SIGNATURE].split(","))
    expected = hmac.new(SECRET.encode(), f"{parts['t']}.".encode() + body, hashlib.sha256)
    assert hmac.compare_digest(parts["v1"], expected.hexdigest())
    data: dict[str, Any] = json.loads(body)
    assert headers["X-Minions-Event"] == data["event"]
    return data


def store_events(database: Database, run_id: str, *events: Event) -> None:
    """`events` stored as the run's log after what it has (numbered on), as a holder writes."""
    with database.begin() as db:
        last = db.execute(
            sa.text("SELECT last_seq FROM minions_runs WHERE run_id = :r"), {"r": run_id}
        ).scalar_one()
        rows = [
            row_of(dataclasses.replace(e, run_id=run_id, seq=last + i))
            for i, e in enumerate(events, 1)
        ]
        db.execute(
            sa.text("UPDATE minions_runs SET last_seq = :s WHERE run_id = :r"),
            {"s": last + len(rows), "r": run_id},
        )
        insert_events(db, run_id, rows)


def hold(database: Database, run_id: str, *, claimed_at: float, started_at: float) -> None:
    """The run held by a worker, claimed at `claimed_at`."""
    with database.begin() as db:
        db.execute(
            sa.text(
                "UPDATE minions_runs SET status = 'running', holder = 'w1', epoch = epoch + 1, "
                "lease_until = :until, started_at = :started, claimed_at = :claimed "
                "WHERE run_id = :r"
            ),
            {"r": run_id, "until": claimed_at + 10, "started": started_at, "claimed": claimed_at},
        )


async def a_store_with_one_of_each(url: str, tmp_path: Path) -> float:
    """A failed run, a run waiting for approval, a run with no progress for 20 minutes, a
    schedule whose slot fired 10 minutes late, and a run that is fine; the time now."""
    store = RunStore(url, create=True)
    added = await store.add_schedule(write_ledger_recipe(tmp_path), every="1h", inputs={"tag": "s"})
    await store.aclose()
    now = added.next_at + 600
    database = Database(url)
    Scheduler(database, lambda *_: None, clock=lambda: now).tick()  # the slot fires late
    for run_id in ("failed", "waiting", "stuck", "fine"):
        insert_run(database, run_id)
    with database.begin() as db:
        db.execute(
            sa.text(
                "UPDATE minions_runs SET status = 'failed', error = 'step x failed: boom', "
                "finished_at = :now WHERE run_id = 'failed'"
            ),
            {"now": now - 5},
        )
        db.execute(sa.text("UPDATE minions_runs SET status = 'waiting' WHERE run_id = 'waiting'"))
        db.execute(
            sa.text(
                "INSERT INTO minions_approvals (run_id, call_id, step_id, tool, arguments, "
                "requested_at) VALUES ('waiting', 'c1', 'pay', 'transfer', '{}', :now)"
            ),
            {"now": now - 30},
        )
    for run_id in ("stuck", "fine"):
        hold(database, run_id, claimed_at=now - 1200, started_at=now - 1200)
        store_events(database, run_id, RunStarted(timestamp=now - 1200))
    store_events(database, "fine", StepStarted(step_id="s", timestamp=now - 10))
    database.close()
    return now


async def test_each_is_delivered_once_signed_and_retried_after_the_receiver_was_down(
    tmp_path: Path, url: str
) -> None:
    clock = [await a_store_with_one_of_each(url, tmp_path)]
    port = free_port()
    target = NotifyTarget.parse(f"http://127.0.0.1:{port}/hooks/minions")
    notifier = Notifier(url, [target], secret=SECRET, stuck_after=900, clock=lambda: clock[0])
    # Another process told the same URL: what it finds is the same notifications.
    twin = Notifier(url, [target], secret=SECRET, stuck_after=900, clock=lambda: clock[0])
    try:
        assert notifier.find() == 4
        assert (twin.find(), notifier.find()) == (0, 0)
        # Nobody listens yet: nothing delivered, the error kept, retried after a backoff.
        assert notifier.deliver() == 0
        (down,) = deliveries(notifier.database)
        assert (down.pending, down.delivered) == (4, 0)
        # Its origin and id, never its path (often a webhook's secret).
        assert down.target == f"http://127.0.0.1:{port}/… ({target.id[:8]})"
        assert down.last_error is not None
        assert "Connect" in down.last_error
        assert notifier.deliver() == 0  # not due again yet
        with Receiver(port).up() as receiver:
            assert not receiver.got
            clock[0] += notifier.backoff
            assert notifier.deliver() + twin.deliver() == 4
            assert (notifier.deliver(), twin.deliver(), notifier.find()) == (0, 0, 0)
            # An hour later: none of the four is told again; `fine` has made no progress
            # since, and is stuck now (one new notification, not sent yet).
            clock[0] += 3600.0
            assert notifier.find() == 1
            got = [verified(headers, body) for headers, body in receiver.got]
    finally:
        notifier.close()
        twin.close()
    by_event = {g["event"]: g for g in got}
    assert sorted(by_event) == ["run_failed", "run_stuck", "run_waiting", "schedule_late"]
    assert len(got) == 4
    assert (by_event["run_failed"]["run_id"], by_event["run_failed"]["error"]) == (
        "failed",
        "step x failed: boom",
    )
    assert (by_event["run_waiting"]["tool"], by_event["run_waiting"]["step"]) == ("transfer", "pay")
    assert by_event["run_stuck"]["run_id"] == "stuck"  # `fine` made progress 10 s ago
    assert by_event["run_stuck"]["stuck_for"] >= 1200
    late = by_event["schedule_late"]
    assert (late["schedule"], late["why"], late["reason"], late["late_by"]) == (
        "ledger",
        "late",
        "late",
        600,
    )
    store = Database(url)
    (done,) = deliveries(store)
    store.close()
    assert (done.delivered, done.pending, done.failed, done.last_error) == (4, 1, 0, None)


async def test_a_target_gets_only_the_kinds_it_asked_for(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    now = await a_store_with_one_of_each(url, tmp_path)
    only = NotifyTarget.parse("failed,late=https://hooks.example/x?key=1")
    assert only.kinds == {"failed", "late"}
    notifier = Notifier(url, [only], secret=SECRET, clock=lambda: now)
    assert notifier.find() == 2
    notifier.close()


# -- late: what the schedule flags --------------------------------------------------------------


def told(database: Database, event: str) -> list[dict[str, Any]]:
    """The bodies of the notifications of `event` in the outbox."""
    with database.read() as db:
        rows = db.execute(
            sa.text("SELECT body FROM minions_notifications WHERE event = :e ORDER BY created_at"),
            {"e": event},
        ).all()
    return [json.loads(r.body) for r in rows]


async def test_a_late_or_skipped_slot_is_told_once_as_the_schedule_flags_it(
    tmp_path: Path, url: str
) -> None:
    """What is told is what the scheduler flags: a slot fired over its grace late (with its
    run) and each slot the overlap policy skips, once each; slots fired on time never; slots
    skipped across a gap (catch-up `none`) once, together. A notifier started again tells
    none of them twice, and the slots told are the schedules' own count."""
    recipe = write_ledger_recipe(tmp_path)
    store = RunStore(url, create=True)
    policies: list[tuple[str, Overlap, CatchUp]] = [
        ("allowed", "allow", "one"),  # fires every slot
        ("single", "skip", "one"),  # skips while its run (queued: nothing runs it) is active
        ("gap", "allow", "none"),  # missed three slots while no worker ran
    ]
    for name, overlap, catch_up in policies:
        await store.add_schedule(
            recipe, every="5m", name=name, overlap=overlap, catch_up=catch_up, inputs={"tag": name}
        )
    base = Timing(every=300).after(time.time())
    database = Database(url)
    with database.begin() as db:  # every schedule's next slot is `base`, but the gap's
        db.execute(
            sa.text("UPDATE minions_schedules SET cursor = :c, next_at = :n"),
            {"c": base - 1, "n": base},
        )
        db.execute(
            sa.text("UPDATE minions_schedules SET cursor = :c, next_at = :n WHERE name = 'gap'"),
            {"c": base - 901, "n": base - 900},
        )
    now = [base + 1]
    scheduler = Scheduler(database, lambda *_: None, clock=lambda: now[0])
    notifier = Notifier(url, [LATE], secret=SECRET, clock=lambda: now[0])
    try:
        scheduler.tick()  # on time: the gap's three missed slots are skipped
        assert notifier.find() == 1
        now[0] = base + 301
        scheduler.tick()  # `single`'s run is active: its slot is skipped
        assert (notifier.find(), notifier.find()) == (1, 0)
        now[0] = base + 700
        # 100 s late: `allowed`'s slot fires late, `single`'s and the gap's are skipped
        scheduler.tick()
        assert (notifier.find(), notifier.find()) == (3, 0)
        again = Notifier(url, [LATE], secret=SECRET, clock=lambda: now[0])  # a restart
        assert again.find() == 0
        again.close()
    finally:
        notifier.close()
    late = told(database, "schedule_late")
    database.close()
    said = {(b["schedule"], b["slot"]): b for b in late}
    assert sorted(said) == [
        ("allowed", base + 600),
        ("gap", base - 300),
        ("gap", base + 600),
        ("single", base + 300),
        ("single", base + 600),
    ]
    fired_late = said["allowed", base + 600]
    [run] = [r for r in await store.list_runs(schedule="allowed") if r.slot == base + 600]
    assert (fired_late["why"], fired_late["reason"], fired_late["run_id"]) == (
        "late",
        "late",
        run.run_id,
    )
    assert fired_late["late_by"] == 100
    gap = said["gap", base - 300]
    assert (gap["why"], gap["reason"], gap["slots"], gap["first_slot"]) == (
        "skipped",
        "catch-up",
        3,
        base - 900,
    )
    assert (said["gap", base + 600]["reason"], said["gap", base + 600]["slots"]) == ("catch-up", 1)
    for slot in (base + 300, base + 600):
        skipped = said["single", slot]
        assert (skipped["why"], skipped["reason"], skipped["slots"]) == ("skipped", "overlap", 1)
        assert (skipped["first_slot"], skipped["run_id"]) == (slot, None)
    for schedule in await store.schedules():  # one source of truth
        assert schedule.late_slots == sum(
            b["slots"] for b in late if b["schedule"] == schedule.name
        )
    await store.aclose()


# -- stuck: held, no progress, no known wait ---------------------------------------------------


async def execute(url: str, run_id: str, executor_id: str, **settings: Any) -> None:
    """The run executed in this process, held by `executor_id` (`settings`: its
    `RunSettings`)."""
    from minions import RunSettings
    from minions.runs._async import AsyncDatabase
    from minions.runs._runner import RunExecutor

    store = AsyncDatabase(Database(url), patient=True)
    try:
        runner = RunExecutor(
            store, executor_id=executor_id, incarnation="i", settings=RunSettings(**settings)
        )
        await runner.execute(run_id, 1)
    finally:
        store.close()


def kinds(database: Database, run_id: str) -> list[str]:
    with database.read() as db:
        rows = db.execute(
            sa.text("SELECT kind FROM minions_events WHERE run_id = :r ORDER BY seq"), {"r": run_id}
        ).all()
    return [r.kind for r in rows]


async def test_a_run_in_its_endpoints_line_is_not_stuck_and_one_with_no_progress_is(
    tmp_path: Path, url: str
) -> None:
    """Two runs held by workers, neither with an event for an hour by the notifier's clock:
    one waits in its endpoint's line (the limits hold its model call: `model_call_waiting`),
    the other for an answer that never comes. Only the second is stuck."""
    recipe = tmp_path / "ask.yaml"
    recipe.write_text("id: ask\nsteps:\n  - {id: ask, goal: say hi}\n")
    store = RunStore(url, create=True)
    in_line, _ = await store.submit(recipe, {})
    hung, _ = await store.submit(recipe, {})
    database = Database(url)
    async with FakeOpenAIServer(lambda _: FakeReply.hang(600)) as server:
        limiter = LocalLimiter(
            Limits(endpoints=(EndpointLimit(match=server.url, max_concurrent=1),))
        )
        held = await limiter.acquire((server.url, "fake-model"), tokens=1)  # saturated
        assert held is not None
        model = server.model(timeout=600)
        running = [
            asyncio.create_task(execute(url, in_line, "w1", model=model, limiter=limiter)),
            asyncio.create_task(execute(url, hung, "w2", model=model)),
        ]
        try:
            await until(
                lambda: (
                    kinds(database, in_line)[-1:] == ["model_call_waiting"]
                    and kinds(database, hung)[-1:] == ["model_call_started"]
                )
            )
            later = time.time() + 3600
            notifier = Notifier(database, [STUCK], secret=SECRET, clock=lambda: later)
            assert (notifier.find(), notifier.find()) == (1, 0)
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            limiter.release(held)
    [stuck] = told(database, "run_stuck")
    database.close()
    store.close()
    assert (stuck["run_id"], stuck["steps"]) == (hung, ["ask"])
    assert stuck["stuck_for"] >= 3600


async def test_a_run_claimed_again_or_waiting_for_a_person_is_not_stuck_but_a_hung_branch_is(
    url: str,
) -> None:
    """A run taken over half an hour ago and claimed 5 s ago starts its hold fresh; a run
    parked for a decision (held by nobody) and one parked behind its project's limit are
    not held; of a run with two branches, one in its endpoint's line, the other silent in a
    tool call for 20 minutes, the silent branch is stuck."""
    now = time.time()
    database = Database(url, create=True)
    for run_id in ("retaken", "branches", "parked", "behind"):
        insert_run(database, run_id)
    hold(database, "retaken", claimed_at=now - 5, started_at=now - 7200)
    store_events(
        database,
        "retaken",
        RunStarted(timestamp=now - 7200),
        StepStarted(step_id="a", timestamp=now - 7200),
        RunTakenOver(executor_id="w0", by="w2", timestamp=now - 1800),
    )
    hold(database, "branches", claimed_at=now - 1300, started_at=now - 1300)
    store_events(
        database,
        "branches",
        RunStarted(timestamp=now - 1300),
        StepStarted(step_id="a", timestamp=now - 1300),
        StepStarted(step_id="b", timestamp=now - 1300),
        ModelCallWaiting(step_id="a", endpoint="http://llm:8080/v1", timestamp=now - 1250),
        ToolCallStarted(step_id="b", call_id="c1", name="fetch", timestamp=now - 1200),
    )
    store_events(
        database,
        "parked",
        RunStarted(timestamp=now - 7200),
        StepStarted(step_id="s", timestamp=now - 7200),
        ApprovalRequested(step_id="s", call_id="s#1/c", name="ship", timestamp=now - 7100),
    )
    with database.begin() as db:
        db.execute(
            sa.text(
                "UPDATE minions_runs SET status = 'waiting', started_at = :at WHERE run_id = 'parked'"
            ),
            {"at": now - 7200},
        )
        db.execute(
            sa.text(
                "UPDATE minions_runs SET parked = 'max_runs_in_flight', created_at = :at "
                "WHERE run_id = 'behind'"
            ),
            {"at": now - 7200},
        )
    clock = [now]
    notifier = Notifier(database, [STUCK], secret=SECRET, stuck_after=900, clock=lambda: clock[0])
    assert notifier.find() == 1
    # Fifteen minutes after its claim and still silent, the run taken over is stuck too.
    clock[0] = now + 900
    assert notifier.find() == 1
    notifier.close()
    stuck = {b["run_id"]: b for b in told(database, "run_stuck")}
    database.close()
    assert sorted(stuck) == ["branches", "retaken"]
    assert (stuck["branches"]["steps"], stuck["branches"]["last_progress_at"]) == (
        ["b"],
        now - 1200,
    )
    assert (stuck["retaken"]["steps"], stuck["retaken"]["last_progress_at"]) == ([], now - 5)


@pytest.mark.parametrize("last", [False, True], ids=["amid", "last"])
def test_a_damaged_stored_event_is_passed_over_and_the_run_still_found_stuck(
    url: str, last: bool
) -> None:
    """A stored event the notifier cannot decode (a row that is not JSON, a kind a newer
    minions wrote) does not break its look: it folds the events it can read, and the run,
    silent in a tool call for 20 minutes, is told as stuck in that step. A damaged last
    event leaves the run's claim as its last progress (the look used to fail on it, and
    told nothing)."""
    now = time.time()
    database = Database(url, create=True)
    insert_run(database, "damaged")
    hold(database, "damaged", claimed_at=now - 1300, started_at=now - 1300)
    store_events(
        database,
        "damaged",
        RunStarted(timestamp=now - 1300),
        StepStarted(step_id="a", timestamp=now - 1300),
    )
    with database.begin() as db:
        insert_events(
            db,
            "damaged",
            [
                EventRow(3, "from_the_future", "a", '{"kind": "from_the_future", "seq": 3}'),
                EventRow(4, "step_started", "a", "{not json"),
            ],
        )
        db.execute(sa.text("UPDATE minions_runs SET last_seq = 4 WHERE run_id = 'damaged'"))
    if not last:
        store_events(
            database,
            "damaged",
            ToolCallStarted(step_id="a", call_id="c1", name="fetch", timestamp=now - 1200),
        )
    notifier = Notifier(database, [STUCK], secret=SECRET, stuck_after=900, clock=lambda: now)
    assert notifier.find() == 1
    notifier.close()
    [stuck] = told(database, "run_stuck")
    database.close()
    assert (stuck["run_id"], stuck["steps"], stuck["last_progress_at"]) == (
        "damaged",
        ["a"],
        now - (1300 if last else 1200),
    )


def test_a_store_of_schema_11_migrates_to_claims_and_late_slots(tmp_path: Path) -> None:
    """A store made before claims were kept and late slots recorded gets both, empty, and the
    index of runs by status and end."""
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    made = Database(url, create=True)
    insert_run(made, "before")
    with made.begin() as db:
        db.execute(meta_table.update().values(value="11"))
        db.execute(sa.text("ALTER TABLE minions_runs DROP COLUMN claimed_at"))
        db.execute(sa.text("DROP TABLE minions_schedule_late"))
        db.execute(sa.text("DROP INDEX ix_minions_runs_status_finished"))
    made.close()
    again = Database(url)
    with again.read() as db:
        assert db.execute(sa.text("SELECT claimed_at FROM minions_runs")).scalars().all() == [None]
        # The failed runs since a time are read through their index, not every failed run.
        plan = db.execute(
            sa.text(
                "EXPLAIN QUERY PLAN SELECT run_id FROM minions_runs "
                "WHERE status = 'failed' AND finished_at >= 0"
            )
        ).all()
        assert "ix_minions_runs_status_finished" in " ".join(str(row) for row in plan)
        assert db.execute(sa.text("SELECT count(*) FROM minions_schedule_late")).scalar() == 0
        assert db.execute(sa.select(meta_table.c.value)).scalar() == str(SCHEMA_VERSION)
    again.close()


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("failed=ftp://x/y", "not an http:// or https:// URL"),
        ("broken=https://hooks.example/x", "give URL or KINDS=URL"),
        ("hooks.example", "give URL or KINDS=URL"),
    ],
)
def test_a_bad_notify_target_is_refused(given: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        NotifyTarget.parse(given)


def test_the_commands_refuse_a_bad_notify_or_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MINIONS_NOTIFY_SECRET", raising=False)
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    for command in ("worker", "serve"):
        base = [command, "--database-url", url]
        unsigned = CliRunner().invoke(app, [*base, "--notify", "https://hooks.example/x"])
        assert unsigned.exit_code == 2
        assert "MINIONS_NOTIFY_SECRET" in unsigned.output
        bad = CliRunner().invoke(app, [*base, "--notify", "oops=https://hooks.example/x"])
        assert bad.exit_code == 2
        assert "--notify" in bad.output
        monkeypatch.setenv("MINIONS_NOTIFY_SECRET", SECRET)
        slow = [*base, "--notify", "https://hooks.example/x", "--notify-stuck-after", "soon"]
        late = CliRunner().invoke(app, slow)
        assert late.exit_code == 2
        assert "--notify-stuck-after" in late.output
        monkeypatch.delenv("MINIONS_NOTIFY_SECRET")


def test_serve_with_notify_tells_a_receiver_of_a_failed_and_a_waiting_run(tmp_path: Path) -> None:
    """`minions serve --notify`: the notifier runs beside the server and its worker."""
    import httpx2
    from service_helpers import auth, server, submit, write_recipes

    recipes = write_recipes(tmp_path / "recipes")
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    port = free_port()
    args = ("--recipes", str(recipes), "--notify", f"failed,waiting=http://127.0.0.1:{port}/in")
    env = {"MINIONS_NOTIFY_SECRET": SECRET, "FLAKY_OK": str(tmp_path / "never")}
    with (
        Receiver(port).up() as receiver,
        server(tmp_path, url, *args, **env) as service,
        httpx2.Client(base_url=service.base, headers=auth(), timeout=60) as client,
    ):
        failed = submit(client, "flaky")
        waiting = submit(client, "release")
        deadline = time.monotonic() + 60
        while len(receiver.got) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        got = {verified(h, b)["event"]: verified(h, b) for h, b in receiver.got}
        (status,) = client.get("/notifications").json()
    assert len(receiver.got) == 2
    assert (got["run_failed"]["run_id"], got["run_waiting"]["run_id"]) == (failed, waiting)
    assert (status["delivered"], status["last_error"]) == (2, None)
    assert status["target"].startswith(f"http://127.0.0.1:{port}/… (")
