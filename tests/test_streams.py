"""Token deltas across processes: a run executing on a `minions worker` process streams its
text to the SSE clients of a `minions serve --no-worker` process and to `minions runs events
--follow` in a third process, on SQLite (one host) and on Postgres; never stored."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx2
import pytest
from runs_helpers import WORKER_ENV, worker
from service_helpers import (
    ANSWER,
    auth,
    gated_model,
    read_stream_iter,
    server,
    submit,
    watch_answer,
    write_chat_recipe,
)

from minions.events import Event, TokenDelta
from minions.runs._streams import FIFO_MESSAGE, PG_MESSAGE, decode, encode, merged
from minions.testing import FakeOpenAIServer, FakeReply, FakeRequest

if TYPE_CHECKING:
    from minions.runs import RunStore

# -- messages ------------------------------------------------------------------------------------


def delta(text: str, *, seq: int = 3, attempt: int = 1, run: str = "r1") -> TokenDelta:
    return TokenDelta(run_id=run, seq=seq, step_id="answer", attempt=attempt, text=text)


def test_deltas_that_continue_one_another_are_sent_as_one() -> None:
    given = [
        delta("Be"),
        delta("es "),
        delta("re", attempt=2),
        delta("try", attempt=2),
        delta("x", seq=9),
    ]
    assert [(d.attempt, d.seq, d.text) for d in merged(given)] == [
        (1, 3, "Bees "),
        (2, 3, "retry"),
        (1, 9, "x"),
    ]


@pytest.mark.parametrize("limit", [FIFO_MESSAGE, PG_MESSAGE])
def test_a_batch_fits_its_messages_and_comes_back_whole(limit: int) -> None:
    long = 'é"\\ bees\n' * 3000  # escapes and two-byte characters: longer as JSON than as text
    given = [delta(long), delta("other run", run="r2"), delta("later", seq=5)]
    messages = encode("origin", given, limit)
    assert len(messages) > 1
    assert all(len(m) <= limit and m.endswith(b"\n") and m.count(b"\n") == 1 for m in messages)
    got: dict[tuple[str, int], str] = {}
    for message in messages:
        decoded = decode(message.decode().rstrip("\n"))
        assert decoded is not None
        assert decoded.origin == "origin"
        assert {d.run_id for d in decoded.deltas} == {decoded.run_id}
        for d in decoded.deltas:
            got[(d.run_id, d.seq)] = got.get((d.run_id, d.seq), "") + d.text
    assert got == {("r1", 3): long, ("r2", 3): "other run", ("r1", 5): "later"}


def test_a_publisher_on_postgres_sends_every_piece_of_a_repetitive_text(postgres: str) -> None:
    """Postgres delivers one of two equal payloads of a transaction: a text cut into equal
    pieces would lose all but one of them."""
    import psycopg

    from minions.runs._streams import DeltaPublisher

    listener = psycopg.connect(postgres, autocommit=True)
    listener.execute("LISTEN minions_deltas")
    publisher = DeltaPublisher(postgres, interval=1.0, batch_chars=100_000)  # one batch
    publisher.start()
    publisher.heard("follower +r1")
    for _ in range(5000):
        publisher.publish(delta("tok "))
    publisher.stop()
    received = ""
    for note in listener.notifies(timeout=1.0):
        decoded = decode(note.payload)
        assert decoded is not None
        received += "".join(d.text for d in decoded.deltas)
    listener.close()
    assert received == "tok " * 5000
    assert publisher.sent > 1


def notified(listener: Any) -> dict[str, str]:
    """The text of the deltas notified on the `listener` connection (a second of quiet ends
    it), by run; a worker's ask (``?``) is not a delta."""
    received: dict[str, str] = {}
    for note in listener.notifies(timeout=1.0):
        if note.payload == "?":
            continue
        decoded = decode(note.payload)
        assert decoded is not None, note.payload
        received[decoded.run_id] = received.get(decoded.run_id, "") + "".join(
            d.text for d in decoded.deltas
        )
    return received


def test_a_publisher_on_postgres_sends_only_what_somebody_follows(postgres: str) -> None:
    """Nothing of a run nobody follows goes on the wire; what was streamed in the last
    seconds before its first follower came goes then; a run left, a follow that ran out, and
    the followers of the publisher's own process (they have the hub) stop it."""
    import psycopg
    from postgres import fresh_database

    from minions.runs._streams import FOLLOW_TTL, KEPT, DeltaPublisher

    url = fresh_database(postgres, f"t{uuid.uuid4().hex[:12]}")
    listener = psycopg.connect(url, autocommit=True)
    listener.execute("LISTEN minions_deltas")
    now = [100.0]
    publisher = DeltaPublisher(url, origin="self", clock=lambda: now[0])
    publisher.start()
    publisher.publish(delta("long ago ", run="r1"))  # nobody follows: kept a while, then not
    now[0] += KEPT + 1
    publisher.publish(delta("just before ", run="r1"))  # kept for a follower on its way
    publisher.heard("api1 +r1")
    publisher.publish(delta("followed ", run="r1"))
    publisher.heard("api2 +r1 +r2")  # a second follower: nothing again
    publisher.heard("api1 -r1")
    publisher.publish(delta("still ", run="r1"))  # api2 follows still
    publisher.heard("api2 -r1")
    publisher.publish(delta("left", run="r1"))
    publisher.heard("self +r3")  # the publisher's own process
    publisher.publish(delta("hub", run="r3"))
    publisher.publish(delta("two", run="r2"))
    now[0] += FOLLOW_TTL + 1  # api2 said nothing since: it is gone
    publisher.publish(delta("ran out", run="r2"))
    publisher.stop()
    received = notified(listener)
    listener.close()
    assert received == {"r1": "just before followed still ", "r2": "two"}
    assert publisher.batches >= 1


class QueuedRuns:
    """Two runs queued in a fresh Postgres store with no worker, and the follow notes heard on
    it (`two_queued_runs`)."""

    def __init__(self, store: RunStore, runs: tuple[str, str], heard: AsyncIterator[Any]) -> None:
        self.store = store
        self.runs = runs
        self._heard = heard

    async def note(self) -> list[str]:
        """The words of the next follow note."""
        received = await asyncio.wait_for(anext(self._heard), 10)
        words: list[str] = received.payload.split()
        return words

    def follow(self, run: str) -> asyncio.Task[None]:
        async def follow() -> None:
            async for _ in self.store.follow(run):
                pass

        return asyncio.create_task(follow())

    async def first_follow(self, run: str) -> tuple[asyncio.Task[None], str]:
        """A follow of `run`, the process's first, once the process said so; and the name in
        the process's notes."""
        task = self.follow(run)
        origin, *said = await self.note()
        assert said == [f"+{run}"]
        return task, origin


@asynccontextmanager
async def two_queued_runs(postgres: str, tmp_path: Path) -> AsyncIterator[QueuedRuns]:
    import psycopg
    from postgres import fresh_database

    from minions.runs import RunStore

    url = fresh_database(postgres, f"t{uuid.uuid4().hex[:12]}")
    listener = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await listener.execute("LISTEN minions_follows")
    recipe = tmp_path / "s.yaml"
    recipe.write_text("id: s\nsteps:\n  - {id: one, goal: Say hi.}\n")
    store = RunStore(url, create=True)
    try:
        first, _ = await store.submit(recipe)
        second, _ = await store.submit(recipe)
        yield QueuedRuns(store, (first, second), listener.notifies())
    finally:
        await store.aclose()
        await listener.close()


async def test_a_follower_on_postgres_tells_the_workers_what_it_follows(
    postgres: str, tmp_path: Path
) -> None:
    """A process following a run says so on `minions_follows` before it reads the run's
    events, again when a worker asks, and says it left when its last follower leaves."""
    import psycopg
    from runs_helpers import until

    async with two_queued_runs(postgres, tmp_path) as queued:
        run_id, other = queued.runs
        first, origin = await queued.first_follow(run_id)
        second = queued.follow(run_id)  # the same run: nothing more to say
        third = queued.follow(other)
        assert await queued.note() == [origin, f"+{other}"]
        with psycopg.connect(queued.store.url, autocommit=True) as worker:  # it asks
            worker.execute("NOTIFY minions_deltas, '?'")
        assert sorted(await queued.note()) == sorted([origin, f"+{run_id}", f"+{other}"])
        # `second`'s first read of the store may answer after all this on a busy machine:
        # `first` would leave alone, and the process say it left.
        await until(lambda: queued.store.log.followers() == 3)
        for task in (first, third):
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert not second.done(), second  # (its repr says how it ended)
        assert await queued.note() == [origin, f"-{other}"]  # `second` follows `run_id` still
        second.cancel()
        await asyncio.gather(second, return_exceptions=True)
        assert await queued.note() == [origin, f"-{run_id}"]


def held_leave_note(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """The first follow note of a run left waits (a slow database) until the second event
    returned is set; the first is set once it waits."""
    from minions.runs import _streams as streams

    slow, through = threading.Event(), threading.Event()
    announce = streams.announce

    def slowly(database: Any, notes: Any) -> None:
        if any(" -" in note for note in notes) and not slow.is_set():
            slow.set()
            through.wait(30)
        announce(database, notes)

    monkeypatch.setattr(streams, "announce", slowly)
    return slow, through


async def test_a_follower_on_postgres_says_it_left_while_another_note_is_on_its_way(
    postgres: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last follower of a process leaves while the process's note of another change is
    still on its way (a slow database): the process says it left once that note is through
    (it used to say nothing, and the workers sent the run's text for nobody for 30 s)."""
    from runs_helpers import until

    slow, through = held_leave_note(monkeypatch)
    try:
        async with two_queued_runs(postgres, tmp_path) as queued:
            run_id, other = queued.runs
            first, origin = await queued.first_follow(run_id)
            second = queued.follow(other)
            assert await queued.note() == [origin, f"+{other}"]
            second.cancel()
            await asyncio.gather(second, return_exceptions=True)
            assert await asyncio.to_thread(slow.wait, 30)  # "-other" is on its way
            first.cancel()  # the process's last follower leaves meanwhile
            await until(lambda: queued.store.log.feeds() == 0)
            for _ in range(10):  # the log goes on to close (a few turns of the loop)
                await asyncio.sleep(0)
            through.set()
            assert await queued.note() == [origin, f"-{other}"]
            assert await queued.note() == [origin, f"-{run_id}"]
            await asyncio.gather(first, return_exceptions=True)
    finally:
        through.set()


async def test_a_follower_on_postgres_that_comes_as_the_last_one_leaves_is_announced(
    postgres: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower comes while the process's last follower leaves, its note that it left still
    on its way (a slow database): the process says it follows the run again once that note is
    through (the new follower found the LISTEN connection open as it was being closed, and
    the workers were never told: no token deltas for it, and no wake-up at each commit)."""
    from runs_helpers import until

    from minions.runs._log import EventLog

    slow, through = held_leave_note(monkeypatch)
    came = asyncio.Event()
    subscribe = EventLog._subscribe

    @asynccontextmanager
    async def subscribing(log: EventLog, run_id: str) -> AsyncIterator[Any]:
        came.set()  # as the follower reaches the log (what it does then is done as it waits)
        async with subscribe(log, run_id) as subscription:
            yield subscription

    monkeypatch.setattr(EventLog, "_subscribe", subscribing)
    try:
        async with two_queued_runs(postgres, tmp_path) as queued:
            run_id, _ = queued.runs
            first, origin = await queued.first_follow(run_id)
            came.clear()
            first.cancel()  # the process's last follower leaves
            assert await asyncio.to_thread(slow.wait, 30)  # "-run_id" is on its way
            await until(lambda: queued.store.log.feeds() == 0)
            for _ in range(10):  # the log goes on to close (a few turns of the loop)
                await asyncio.sleep(0)
            second = queued.follow(run_id)  # and another comes meanwhile
            await asyncio.wait_for(came.wait(), 10)
            through.set()
            assert await queued.note() == [origin, f"-{run_id}"]
            assert await queued.note() == [origin, f"+{run_id}"]
            await asyncio.gather(first, return_exceptions=True)
            second.cancel()
            await asyncio.gather(second, return_exceptions=True)
            assert await queued.note() == [origin, f"-{run_id}"]
    finally:
        through.set()


async def test_a_follower_on_postgres_cancelled_as_its_note_goes_out_stops(
    postgres: str, tmp_path: Path
) -> None:
    """A follow cancelled just as its process tells the workers of it (a client that goes at
    once) ends, again and again (a cancel that came as the follow's wait for its note ended
    was lost on Python 3.11, and the follow went on, unread, for ever)."""
    async with two_queued_runs(postgres, tmp_path) as queued:
        run_id, _ = queued.runs
        for _ in range(40):
            follower = queued.follow(run_id)
            origin, *said = await queued.note()
            assert said == [f"+{run_id}"]
            follower.cancel()
            done, _ = await asyncio.wait({follower}, timeout=10)
            assert follower in done, "a cancelled follower goes on following"
            assert await queued.note() == [origin, f"-{run_id}"]


def test_a_publisher_on_sqlite_holds_nothing_while_nobody_follows(tmp_path: Path) -> None:
    from minions.runs._streams import DeltaPublisher, FifoReader, streams_folder

    url = f"sqlite:///{tmp_path / 'minions.db'}"
    publisher = DeltaPublisher(url, interval=5.0)  # held until stopped, unless dropped
    publisher.start()
    publisher.publish(delta("nobody hears this "))
    folder = streams_folder(url)
    assert folder is not None
    reader = FifoReader(folder)  # a follower comes
    publisher.publish(delta("but this"))
    publisher.stop()
    heard = [decode(m) for m in reader.read()]
    reader.close()
    assert ["".join(d.text for d in h.deltas) for h in heard if h is not None] == ["but this"]


@pytest.mark.parametrize("message", ["", "x", "o r", "o r [1]", "o r [[1,2]]", "o r {}"])
def test_a_message_of_another_shape_is_ignored(message: str) -> None:
    assert decode(message) is None


# -- across processes ----------------------------------------------------------------------------


@pytest.fixture
def model() -> Iterator[tuple[FakeOpenAIServer, threading.Event]]:
    """A model server whose answer waits for the test's go: every follower watches first."""
    with gated_model() as (server, go):
        yield server, go


def lines_of(process: subprocess.Popen[str]) -> queue.Queue[str | None]:
    """The lines `process` prints, as they come (None: it ended)."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


@pytest.mark.slow
def test_token_deltas_of_a_worker_process_reach_other_processes(
    url: str, tmp_path: Path, model: tuple[FakeOpenAIServer, threading.Event]
) -> None:
    fake, go = model
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    write_chat_recipe(recipes, fake.url)
    with (
        server(tmp_path, url, "--no-worker", "--recipes", str(recipes)) as api,
        worker(url, tmp_path, "w1", tmp_path / "ledger.txt"),
        httpx2.Client(base_url=api.base, headers=auth(), timeout=60) as client,
    ):
        run_id = submit(client, "chat")
        follower = subprocess.Popen(
            [sys.executable, "-m", "minions", "runs", "events", run_id, "--follow", "--json",
             "--database-url", url],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, **WORKER_ENV},
        )  # fmt: skip
        printed = lines_of(follower)
        # A person's follower: one line per stored event, none for the text as it streams.
        person = subprocess.Popen(
            [sys.executable, "-m", "minions", "runs", "events", run_id, "--follow",
             "--database-url", url],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, **WORKER_ENV},
        )  # fmt: skip
        try:
            messages = []
            with client.stream("GET", f"/runs/{run_id}/events/stream") as response:
                for message in read_stream_iter(response):
                    messages.append(message)
                    if message["event"] != "model_call_started":
                        continue
                    # The other follower has read the same stored event: it listens now.
                    while True:
                        line = printed.get(timeout=60)
                        assert line is not None, "the follower ended before the answer"
                        if json.loads(line)["kind"] == "model_call_started":
                            break
                    go.set()  # the model answers once both watch
            assert follower.wait(60) == 0
            shown, _ = person.communicate(timeout=60)
        finally:
            for process in (follower, person):
                if process.poll() is None:
                    process.kill()
                process.wait()
        followed = []
        while (line := printed.get(timeout=10)) is not None:
            followed.append(json.loads(line))
        stored = client.get(f"/runs/{run_id}/events").json()
        record = client.get(f"/runs/{run_id}").json()
    assert record["output"] == ANSWER
    assert record["executor_id"] == "w1"  # the API process ran nothing itself
    assert all(e["kind"] != "token_delta" for e in stored)  # never stored
    # The SSE client: every stored event once, in order, the answer's text between.
    deltas = [m for m in messages if m["event"] == "token_delta"]
    assert "".join(d["data"]["text"] for d in deltas) == ANSWER
    assert all("id" not in d for d in deltas)
    assert [m["data"] for m in messages if m["event"] != "token_delta"] == stored
    kinds = [m["event"] for m in messages]
    first, last = kinds.index("token_delta"), len(kinds) - 1 - kinds[::-1].index("token_delta")
    assert kinds[first - 1] == "model_call_started"
    assert kinds[last + 1] == "model_call_completed"
    # The follower of a third process: the same.
    texts = [e["text"] for e in followed if e["kind"] == "token_delta"]
    assert "".join(texts) == ANSWER
    assert [e for e in followed if e["kind"] != "token_delta"][-1]["kind"] == "run_completed"
    assert [line.split()[3] for line in shown.splitlines()] == [e["kind"] for e in stored]


# -- a worker streams every call -----------------------------------------------------------------

EQUAL = """\
id: equal
description: A tool call, a text answer and a structured one.
model: openai-compatible:fake-model@{url}/v1
tools: [adding]
steps:
  - id: sum
    goal: Add 2 and 3 with the tool, then say the sum.
    tools: [add]
  - id: title
    depends_on: [sum]
    goal: Give the sum a title.
    output: {{title: "", sum: 0}}
"""

ADDING = '''\
from minions import tool


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b
'''


def answer(request: FakeRequest) -> FakeReply:
    """The same answer to the same request, streamed or not."""
    if request.response_format is not None or request.forced_tool is not None:
        return FakeReply.structured({"title": "Five, the sum of two and three", "sum": 5})
    if request.last_message["role"] == "tool":
        return FakeReply.text(f"The sum is {request.last_message['content']}, at last.")
    return FakeReply.calls(("add", {"a": 2, "b": 3}))


async def test_a_worker_streams_every_call_and_records_the_same_answers(tmp_path: Path) -> None:
    from runs_helpers import run_here

    from minions import AgentExecutor
    from minions.errors import StreamingWarning
    from minions.recipes import load_recipe
    from minions.runs import RunStore

    def said(events: list[Event]) -> list[tuple[object, ...]]:
        """What each model call answered, as its events tell it."""
        return [
            (e.step_id, e.finish_reason, e.tool_calls, e.output_mode, e.usage)
            for e in events
            if e.kind == "model_call_completed"
        ]

    with FakeOpenAIServer(answer) as fake:
        recipe = tmp_path / "equal.yaml"
        recipe.write_text(EQUAL.format(url=fake.url))
        (tmp_path / "adding.py").write_text(ADDING)
        heard: list[Event] = []
        with pytest.warns(StreamingWarning):  # the foreground run's listener gets no deltas
            alone = await AgentExecutor().execute(load_recipe(recipe), listeners=[heard.append])
        plain = len(fake.requests)
        url = f"sqlite:///{tmp_path / 'minions.db'}"
        store = RunStore(url, create=True)
        run_id, _ = await store.submit(recipe)
        await run_here(url, run_id)
        record = await store.get(run_id)
        events = await store.events(run_id)
    # Nobody asked the worker to stream: it did, every call (a tool call, text, structured).
    assert [r.stream for r in fake.requests] == [False] * plain + [True] * plain
    assert plain == 3
    # And recorded what the same calls answer without streaming.
    assert record.status == "completed"
    assert alone.error is None
    assert record.output == {"title": "Five, the sum of two and three", "sum": 5}
    assert record.output == alone.output
    assert [s.output for s in record.steps] == ["The sum is 5, at last.", record.output]
    assert said(events) == said(heard)
    assert [e.tool_calls for e in events if e.kind == "model_call_completed"] == [
        ("add",),
        (),
        (),
    ]
    # What each call was sent (the answers before it, as recorded) is the same too, but for
    # the ids the server gave the tool calls.
    sent = [re.sub(r"call_[0-9]+", "call", json.dumps(r.messages)) for r in fake.requests]
    assert sent[plain:] == sent[:plain]


WAITING = """\
id: waiting
tools: [waiting_tools]
steps:
  - {id: first, tool: current_datetime}
  - {id: hold, depends_on: [first], tool: hold, params: {path: "{{ inputs.gate }}"}}
inputs: {gate: {type: string}}
"""

HOLDING = '''\
import time
from pathlib import Path

from minions import tool


@tool
def hold(path: str) -> str:
    """Return once `path` exists."""
    while not Path(path).exists():
        time.sleep(0.01)
    return "released"
'''


async def test_a_late_delta_never_takes_a_follower_back(tmp_path: Path) -> None:
    """Text a worker streamed before a later stored event, reaching a follower after that
    event (deltas travel apart from the commits), is dropped: the number of the last event a
    follower received is always a place to resume from (it used to go back, and the events
    after it came twice)."""
    from runs_helpers import run_here, until

    from minions.runs import LiveHub, RunStore

    (tmp_path / "waiting.yaml").write_text(WAITING)
    (tmp_path / "waiting_tools.py").write_text(HOLDING)
    gate = tmp_path / "gate"
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    hub = LiveHub()
    store = RunStore(url, create=True, hub=hub)
    try:
        run_id, _ = await store.submit(tmp_path / "waiting.yaml", {"gate": str(gate)})
        received: list[Event] = []

        async def follow() -> None:
            async for event in store.follow(run_id):
                received.append(event)

        following = asyncio.create_task(follow())
        await until(lambda: store.log.feeds() == 1)
        running = asyncio.create_task(run_here(url, run_id))
        await until(
            lambda: any(e.kind == "tool_call_started" and e.step_id == "hold" for e in received)
        )
        position = received[-1].seq
        assert position > 2
        hub.publish(TokenDelta(run_id=run_id, seq=1, step_id="first", text="late"))
        hub.publish(TokenDelta(run_id=run_id, seq=position, step_id="hold", text="now"))
        await until(lambda: received[-1].kind == "token_delta")
        gate.touch()
        await asyncio.wait_for(running, timeout=60)
        await asyncio.wait_for(following, timeout=60)
    finally:
        await store.aclose()
    assert [e.text for e in received if isinstance(e, TokenDelta)] == ["now"]
    seqs = [e.seq for e in received]
    assert seqs == sorted(seqs)
    stored = [e for e in received if e.kind != "token_delta"]
    assert [e.seq for e in stored] == list(range(1, len(stored) + 1))


# -- on Postgres, nothing for nobody -------------------------------------------------------------

FIRST = "Nobody hears this first answer of the run."
BEFORE = "Part one streams while nobody follows, "
AFTER = "and part two once a follower has come."

TWO_STEPS = """\
id: two
model: openai-compatible:fake-model@{url}/v1
steps:
  - {{id: first, goal: Begin.}}
  - {{id: second, depends_on: [first], goal: Go on.}}
"""


@contextmanager
def streaming_model(pieces: Callable[[str], Iterable[str]]) -> Iterator[str]:
    """An OpenAI-compatible server that streams each answer piece by piece as `pieces` (called
    with the request's messages as JSON, in the server's thread) yields them. Yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            """Silent."""

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.send({"role": "assistant", "content": ""})
            for piece in pieces(json.dumps(body["messages"])):
                self.send({"content": piece})
            self.send({}, "stop")
            usage = {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}
            self.write(f"data: {json.dumps({**self.head(), 'choices': [], 'usage': usage})}")
            self.write("data: [DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def head(self) -> dict[str, Any]:
            return {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m"}

        def send(self, delta: dict[str, Any], finish: str | None = None) -> None:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            self.write(f"data: {json.dumps({**self.head(), 'choices': [choice]})}")

        def write(self, line: str) -> None:
            data = f"{line}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def pausing_model() -> Iterator[tuple[str, threading.Event, threading.Event]]:
    """A model server that streams each answer word by word: `FIRST` to the first step, and
    to the second `BEFORE`, then (once it said so: `paused`) nothing until the test says
    `go`, then `AFTER`. Yields its URL and the two events."""
    paused, go = threading.Event(), threading.Event()

    def pieces(messages: str) -> Iterator[str]:
        second = "Go on." in messages
        yield from re.findall(r"\S+\s*", BEFORE if second else FIRST)
        if second:
            paused.set()
            go.wait(60)
            yield from re.findall(r"\S+\s*", AFTER)

    with streaming_model(pieces) as url:
        try:
            yield url, paused, go
        finally:
            go.set()


@pytest.mark.slow
async def test_on_postgres_only_the_deltas_somebody_follows_are_sent(
    postgres: str, tmp_path: Path
) -> None:
    """A worker process streams every model call; on Postgres it notifies none of the text
    of a run nobody follows, and a follower that comes in the middle of an answer gets the
    rest of it; the answers recorded are the whole answers."""
    import psycopg
    from postgres import fresh_database
    from runs_helpers import until

    from minions.runs import RunStore

    url = fresh_database(postgres, f"t{uuid.uuid4().hex[:12]}")
    listener = psycopg.connect(url, autocommit=True)
    listener.execute("LISTEN minions_deltas")  # what goes on the wire, from the start
    store = RunStore(url, create=True)
    try:
        with pausing_model() as (model_url, paused, go):
            recipe = tmp_path / "two.yaml"
            recipe.write_text(TWO_STEPS.format(url=model_url))
            run_id, _ = await store.submit(recipe)
            with worker(url, tmp_path, "w1", tmp_path / "ledger.txt"):
                # The first answer streamed whole with nobody following; the second is half
                # way through.
                assert await asyncio.to_thread(paused.wait, 60)
                received: list[Event] = []

                async def follow() -> None:
                    async for event in store.follow(run_id):
                        received.append(event)

                following = asyncio.create_task(follow())
                # It read the stored events: the workers were told it follows.
                await until(
                    lambda: any(
                        e.kind == "model_call_started" and e.step_id == "second" for e in received
                    )
                )
                go.set()
                await asyncio.wait_for(following, 60)
        record = await store.get(run_id)
    finally:
        await store.aclose()
    wire = notified(listener)
    listener.close()
    assert record.status == "completed"
    assert [s.output for s in record.steps] == [FIRST, BEFORE + AFTER]
    # Nothing of the first answer went on the wire: nobody followed.
    assert set(wire) <= {run_id}
    sent = wire.get(run_id, "")
    assert FIRST.split()[0] not in sent
    # The follower got the rest of the second answer from the time it came (perhaps some
    # of what the worker kept from just before).
    got = "".join(e.text for e in received if isinstance(e, TokenDelta))
    assert all(e.step_id == "second" for e in received if isinstance(e, TokenDelta))
    assert got.endswith(AFTER)
    assert (BEFORE + AFTER).endswith(got)
    assert sent == got


@pytest.mark.slow
def test_a_service_with_its_own_worker_streams_through_its_hub_only(
    postgres: str, tmp_path: Path, model: tuple[FakeOpenAIServer, threading.Event]
) -> None:
    """`minions serve` with its worker (Postgres): its SSE clients get every token delta
    through the process's hub, and nothing goes on the wire, where no other process
    follows."""
    import psycopg
    from postgres import fresh_database

    fake, go = model
    url = fresh_database(postgres, f"t{uuid.uuid4().hex[:12]}")
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    write_chat_recipe(recipes, fake.url)
    listener = psycopg.connect(url, autocommit=True)
    listener.execute("LISTEN minions_deltas")
    with (
        server(tmp_path, url, "--recipes", str(recipes)) as api,
        httpx2.Client(base_url=api.base, headers=auth(), timeout=60) as client,
    ):
        run_id = submit(client, "chat")
        messages = watch_answer(client, run_id, go)
        record = client.get(f"/runs/{run_id}").json()
    wire = notified(listener)
    listener.close()
    assert record["output"] == ANSWER
    deltas = [m["data"]["text"] for m in messages if m["event"] == "token_delta"]
    assert "".join(deltas) == ANSWER
    assert wire == {}


# -- on Postgres, across a restart ---------------------------------------------------------------

TALK = """\
id: talk
model: openai-compatible:fake-model@{url}/v1
steps:
  - {{id: talk, goal: Talk as {name}.}}
"""


@contextmanager
def fed_model(*names: str) -> Iterator[tuple[str, dict[str, queue.Queue[str | None]]]]:
    """A model server whose answer to the step ``Talk as NAME.`` streams what the test puts
    in `feeds[NAME]`, each piece at once, until None. Yields its URL and the feeds."""
    feeds: dict[str, queue.Queue[str | None]] = {name: queue.Queue() for name in names}

    def pieces(messages: str) -> Iterator[str]:
        [feed] = [f for name, f in feeds.items() if f"Talk as {name}." in messages]
        while (piece := feed.get(timeout=60)) is not None:
            yield piece

    with streaming_model(pieces) as url:
        try:
            yield url, feeds
        finally:
            for feed in feeds.values():
                feed.put(None)


class Talk:
    """A run's answer as the test feeds it (`said`), and what a follower of the run in this
    process received (`follow`)."""

    def __init__(self, feed: queue.Queue[str | None]) -> None:
        self.feed = feed
        self.said: list[str] = []
        self.received: list[Event] = []
        self.following: asyncio.Task[None] | None = None

    def say(self, word: str) -> None:
        self.said.append(f"{word}{len(self.said)} ")
        self.feed.put(self.said[-1])

    def follow(self, store: RunStore, run_id: str) -> None:
        async def follow() -> None:
            async for event in store.follow(run_id):
                self.received.append(event)

        self.following = asyncio.create_task(follow())

    def started(self) -> bool:
        """Whether the follower read the start of the run's model call."""
        return any(e.kind == "model_call_started" for e in self.received)

    def heard(self, word: str) -> bool:
        return any(isinstance(e, TokenDelta) and word in e.text for e in self.received)

    async def until_heard(self, word: str, within: float = 20) -> None:
        """Say ``WORD0 ``, ``WORD1 ``... one at a time until the follower has heard one
        (deltas are best effort: what a worker streams while the database is away is
        lost)."""
        deadline = time.monotonic() + within
        while not self.heard(word):
            assert self.following is not None
            assert not self.following.done(), "the follow ended before the run did"
            assert time.monotonic() < deadline, f"the follower never heard {word!r}"
            self.say(word)
            for _ in range(10):
                await asyncio.sleep(0.02)
                if self.heard(word):
                    break

    async def end(self) -> None:
        """End the answer, and the follow with the run."""
        self.feed.put(None)
        assert self.following is not None
        await asyncio.wait_for(self.following, 60)


def terminate_connections(url: str) -> None:
    """End every connection to the database of `url` but this one (as a proxy, a failover
    or an operator would): the LISTEN connections of every process with them."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as admin:
        ended = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
    assert ended is not None
    assert ended[0] > 0


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["restart", "terminate"])
async def test_on_postgres_followers_get_the_text_again_after_the_database_comes_back(
    fault: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs stream on a worker process; another process follows the first. Postgres
    restarts (stopped ``-m immediate``, as by a crash, and started two seconds later), or
    every connection to it is ended:

    - the follow of the first waits (it used to end, as if the run had, when it read in the
      outage), and once the database is back it gets the run's text again (its process
      listens again; the worker, which knows it follows, sends again);
    - the second gets its first follower (a second store here: a process of its own to the
      workers) after the outage but before the worker listens again (held): the follower's
      note is lost, and the worker's ask when it listens again has it said again, so it gets
      the text too (with no refresh due for minutes);
    - each follower reads every stored event of its run once, in order, to the run's end,
      and the last event it received, a token delta, is a place to resume from."""
    from postgres import cluster, fresh_database, pg_ctl
    from runs_helpers import until

    from minions.runs import RunStore
    from minions.runs import _streams as streams

    monkeypatch.setattr(streams, "REFRESH", 600.0)  # only an ask has a follow said again
    hold = tmp_path / "hold-listen"
    async with AsyncExitStack() as stack:
        if fault == "terminate":
            url = fresh_database(request.getfixturevalue("postgres"), f"t{uuid.uuid4().hex[:12]}")
        else:
            url = stack.enter_context(cluster())
        model_url, feeds = stack.enter_context(fed_model("one", "two"))
        runs = []
        store = RunStore(url, create=True)
        stack.push_async_callback(store.aclose)
        for name in ("one", "two"):
            recipe = tmp_path / f"{name}.yaml"
            recipe.write_text(TALK.format(url=model_url, name=name))
            runs.append((await store.submit(recipe))[0])
        stack.enter_context(
            worker(url, tmp_path, "w1", tmp_path / "ledger.txt", HOLD_LISTEN=str(hold))
        )
        one, two = Talk(feeds["one"]), Talk(feeds["two"])
        one.follow(store, runs[0])
        two.say("alone")  # nobody follows the second run yet
        await until(one.started)
        await one.until_heard("before")
        hold.touch()
        if fault == "terminate":
            await asyncio.to_thread(terminate_connections, url)
        else:
            await asyncio.to_thread(pg_ctl, url, "stop")
            await asyncio.sleep(2.0)  # the outage's length: two of the follower's reads
            await asyncio.to_thread(pg_ctl, url, "start")
        await one.until_heard("after")
        await until(lambda: Path(f"{hold}.reached").exists())  # the worker does not listen
        other = RunStore(url)
        stack.push_async_callback(other.aclose)
        two.follow(other, runs[1])
        await until(two.started)  # the worker was told, but did not hear it
        hold.unlink()
        await two.until_heard("later")
        for talk in (one, two):
            await talk.end()
        for run_id, talk in zip(runs, (one, two), strict=True):
            record = await store.get(run_id)
            stored = await store.events(run_id)
            deltas = [e for e in talk.received if isinstance(e, TokenDelta)]
            resumed = [e async for e in store.follow(run_id, after=deltas[-1].seq)]
            assert record.status == "completed"
            assert record.output == "".join(talk.said)
            # Every stored event once, in order, to the end.
            assert [e for e in talk.received if not isinstance(e, TokenDelta)] == stored
            assert [e.seq for e in stored] == list(range(1, len(stored) + 1))
            assert stored[-1].kind == "run_completed"
            # The text in its place (after its call's start): pieces of the answer, in order
            # (what was streamed while the database was away, or nobody followed, is lost).
            [started] = [e.seq for e in stored if e.kind == "model_call_started"]
            assert {d.seq for d in deltas} == {started}
            heard = "".join(d.text for d in deltas).split()
            assert heard == [word for word in record.output.split() if word in heard]
            # The last event received, a delta, is a place to resume from: nothing twice,
            # no gap.
            assert resumed == stored[started:]
