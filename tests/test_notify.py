"""Notifications (``--notify``): a receiver on 127.0.0.1 gets a run failed, a run waiting for
approval, a run stuck and a schedule late, each once, signed with the secret, after it was
down (retried from the store's outbox with backoff); the fleet view says how delivery went."""

from __future__ import annotations

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
from runs_helpers import insert_run, write_ledger_recipe
from service_helpers import free_port
from typer.testing import CliRunner

from minions.cli import app
from minions.runs import Notifier, NotifyTarget, RunStore
from minions.runs._db import Database
from minions.runs._notify import SIGNATURE, deliveries

SECRET = "s3cret-shared-with-the-receiver"


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


async def a_store_with_one_of_each(url: str, tmp_path: Path, now: float) -> None:
    """A failed run, a run waiting for approval, a run with no progress for 20 minutes, a
    schedule whose slot is 10 minutes late, and a run that is fine."""
    store = RunStore(url, create=True)
    await store.add_schedule(write_ledger_recipe(tmp_path), every="1h", inputs={"tag": "s"})
    await store.aclose()
    database = Database(url)
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
        db.execute(
            sa.text(
                "UPDATE minions_runs SET status = 'running', started_at = :at "
                "WHERE run_id IN ('stuck', 'fine')"
            ),
            {"at": now - 1200},
        )
        db.execute(
            sa.text(
                "INSERT INTO minions_events (run_id, seq, kind, step_id, data) "
                "VALUES ('fine', 1, 'step_started', 's', :data)"
            ),
            {"data": json.dumps({"kind": "step_started", "timestamp": now - 10})},
        )
        db.execute(sa.text("UPDATE minions_runs SET last_seq = 1 WHERE run_id = 'fine'"))
        db.execute(sa.text("UPDATE minions_schedules SET next_at = :at"), {"at": now - 600})
    database.close()


async def test_each_is_delivered_once_signed_and_retried_after_the_receiver_was_down(
    tmp_path: Path, url: str
) -> None:
    clock = [time.time()]
    await a_store_with_one_of_each(url, tmp_path, clock[0])
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
    assert by_event["schedule_late"]["schedule"] == "ledger"
    assert by_event["schedule_late"]["late_by"] >= 600
    store = Database(url)
    (done,) = deliveries(store)
    store.close()
    assert (done.delivered, done.pending, done.failed, done.last_error) == (4, 1, 0, None)


async def test_a_target_gets_only_the_kinds_it_asked_for(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    now = time.time()
    await a_store_with_one_of_each(url, tmp_path, now)
    only = NotifyTarget.parse("failed,late=https://hooks.example/x?key=1")
    assert only.kinds == {"failed", "late"}
    notifier = Notifier(url, [only], secret=SECRET, clock=lambda: now)
    assert notifier.find() == 2
    notifier.close()


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
