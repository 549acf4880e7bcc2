"""The run lifecycle under the faults operators met (issue 20), one test each: cancel then
resume from the CLI, a Postgres restart under a worker and under `minions serve`, a killed
`minions submit`, concurrent resumes and decisions, a frozen worker and a second worker with
the same id, a kill inside a loop, ids of any length, an idempotency key reused for another
request, an operator's `dbos workflow cancel`, and models shared across a worker's runs."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import assert_type

import httpx2
import pytest
from postgres import cluster, pg_ctl
from runs_helpers import (
    STEPS,
    WORKER_ENV,
    WorkerProcess,
    finished,
    ledger_lines,
    minions,
    until,
    worker,
    write_ledger_recipe,
)
from service_helpers import auth, server, write_recipes

from minions.errors import IdempotencyConflictError, RunStateError
from minions.events import Event, RunHandedBack
from minions.runs import RunStore, Submitted

pytestmark = pytest.mark.slow


def completed_once(events: list[Event]) -> None:
    """Each step completed once, and the log is numbered 1, 2, 3... with the end last."""
    seqs = [e.seq for e in events]
    assert seqs == list(range(1, len(seqs) + 1))
    kinds = [(e.kind, e.step_id) for e in events]
    assert kinds[-1][0] in ("run_completed", "run_failed")
    done = [step for kind, step in kinds if kind == "step_completed"]
    assert len(done) == len(set(done)), done


# -- cancel, resume, follow --------------------------------------------------------------------


def test_cancel_then_resume_from_the_cli_finishes_the_run(tmp_path: Path, url: str) -> None:
    """Cancel, then resume, each a `minions` command: the run goes on from its last
    completed step and `runs events --follow` follows it to its new end (before, the resumed
    run stayed queued forever, and the follower stopped at the old `run_failed`)."""
    recipe = write_ledger_recipe(tmp_path)
    ledger = tmp_path / "ledger.txt"
    gate = tmp_path / "gate"
    gate.touch()  # each step holds after its effect while the gate is there
    submitted = minions("submit", str(recipe), "-i", "tag=c", "--database-url", url)
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.strip()
    with worker(url, tmp_path, "w1", ledger, GATE=str(gate)):
        asyncio.run(until(lambda: len(ledger_lines(ledger)) >= 1))
        cancelled = minions("runs", "cancel", run_id, "--database-url", url)
        assert cancelled.stdout.strip() == f"run {run_id}: cancelled", cancelled.stderr
        gate.unlink()
        resumed = minions("runs", "resume", run_id, "--database-url", url)
        assert resumed.stdout.strip() == f"run {run_id}: queued", resumed.stderr
        followed = minions("runs", "events", run_id, "--follow", "--json", "--database-url", url)
    lines = [json.loads(line) for line in followed.stdout.splitlines()]
    assert [e["seq"] for e in lines] == list(range(1, len(lines) + 1))
    assert [e["kind"] for e in lines].count("run_failed") == 1  # the cancel, left behind
    assert lines[-1]["kind"] == "run_completed"
    steps = [step for _, step, _ in ledger_lines(ledger)]
    assert sorted(set(steps)) == sorted(STEPS)
    # Step one was held after its effect when the cancel came (not checkpointed): it ran
    # again; the others ran once.
    assert steps == ["one", *STEPS]


async def test_concurrent_resumes_resume_once(tmp_path: Path, url: str) -> None:
    """Eight resumes of one run at once: one wins, seven are told the state they found; the
    run then runs once (before: 500s, and on SQLite the run ran twice at once)."""
    recipe = write_ledger_recipe(tmp_path)
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(recipe, {"tag": "r"})
    await store.cancel(run_id)
    callers = [RunStore(url) for _ in range(8)]
    outcomes = await asyncio.gather(*(c.resume(run_id) for c in callers), return_exceptions=True)
    won = [o for o in outcomes if not isinstance(o, BaseException)]
    lost = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(won) == 1, outcomes
    assert all(isinstance(o, RunStateError) and o.status == "queued" for o in lost), lost
    with worker(url, tmp_path, "w1", tmp_path / "ledger.txt"):
        assert await finished(store, run_id) == "completed"
    assert [step for _, step, _ in ledger_lines(tmp_path / "ledger.txt")] == STEPS
    completed_once(await store.events(run_id))
    assert (await store.get(run_id)).attempt == 2
    for c in callers:
        c.close()


APPROVAL = """\
id: gated
tools: [tools]
inputs: {tag: {type: string}}
steps:
  - id: ship
    tool: mark
    params: {run: "{{ inputs.tag }}", step: ship}
    requires_approval: true
"""


async def test_an_approval_is_decided_once(tmp_path: Path, url: str) -> None:
    """Approve and reject the same call at once: one decision wins, the other is told so
    (before, both got 200 and one decision was silently dropped)."""
    write_ledger_recipe(tmp_path)
    recipe = tmp_path / "gated.yaml"
    recipe.write_text(APPROVAL)
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(recipe, {"tag": "a"})
    with worker(url, tmp_path, "w1", tmp_path / "ledger.txt"):
        for _ in range(1200):
            record = await store.get(run_id)
            if record.status == "waiting":
                break
            await asyncio.sleep(0.05)
        yes, no = RunStore(url), RunStore(url)
        outcomes = await asyncio.gather(
            yes.approve(run_id), no.approve(run_id, approved=False, reason="no"),
            return_exceptions=True,
        )  # fmt: skip
        lost = [o for o in outcomes if isinstance(o, BaseException)]
        assert len(lost) == 1, outcomes
        assert isinstance(lost[0], RunStateError)
        assert "already" in str(lost[0])
        status = await finished(store, run_id)
    approved = not isinstance(outcomes[0], BaseException)
    assert status == ("completed" if approved else "failed")
    [decision] = (await store.get(run_id)).approvals
    assert decision.approved is approved
    yes.close()
    no.close()


# -- database faults ---------------------------------------------------------------------------


@pytest.fixture
def own_postgres() -> Iterator[str]:
    """A cluster of this test's own, to restart."""
    with cluster() as url:
        yield url


async def test_a_worker_survives_a_postgres_restart(tmp_path: Path, own_postgres: str) -> None:
    """`pg_ctl restart -m immediate` under a worker running a run: the worker waits for the
    database, the run goes on from its last checkpoint, and runs submitted afterwards run too
    (before, the worker exited and the run stayed `running` forever)."""
    url = own_postgres
    recipe = write_ledger_recipe(tmp_path, seconds=0.1)
    ledger = tmp_path / "ledger.txt"
    gate = tmp_path / "gate"
    gate.touch()
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(recipe, {"tag": "p"})
    with worker(url, tmp_path, "w1", ledger, GATE=str(gate)) as process:
        await until(lambda: len(ledger_lines(ledger)) >= 1)
        await asyncio.to_thread(pg_ctl, url, "restart")
        gate.unlink()
        assert await finished(store, run_id, within=120) == "completed"
        after, _ = await store.submit(recipe, {"tag": "q"})
        assert await finished(store, after, within=120) == "completed"
        assert process.process.poll() is None  # the worker lives on
    completed_once(await store.events(run_id))
    assert "run store unavailable" in process.log.read_text()


def test_serve_says_when_its_worker_cannot_work(tmp_path: Path, own_postgres: str) -> None:
    """`/health` of `minions serve` reports its worker truthfully: 503 while the database is
    down, 200 once it is back; a run submitted then completes (before, the worker thread died
    silently while /health said ok)."""
    url = own_postgres
    folder = write_recipes(tmp_path / "recipes")
    with server(tmp_path, url, "--recipes", str(folder), LEDGER=str(tmp_path / "l.txt")) as s:
        assert httpx2.get(f"{s.base}/health").json()["worker"] == "running"
        pg_ctl(url, "stop")
        try:
            for _ in range(600):
                health = httpx2.get(f"{s.base}/health", timeout=10)
                # 503 at once (the store does not answer), then the worker says so too.
                if health.status_code == 503 and health.json()["worker"] == "degraded":
                    break
                time.sleep(0.05)
            assert health.status_code == 503, health.text
            assert health.json()["worker"] == "degraded"
        finally:
            pg_ctl(url, "start")
        for _ in range(600):
            if httpx2.get(f"{s.base}/health", timeout=10).status_code == 200:
                break
            time.sleep(0.05)
        created = httpx2.post(
            f"{s.base}/runs", json={"recipe": "ledger", "inputs": {"tag": "h"}}, headers=auth()
        )
        assert created.status_code == 201, created.text
        run_id = created.json()["run_id"]
        for _ in range(1200):
            run = httpx2.get(f"{s.base}/runs/{run_id}", headers=auth()).json()
            if run["status"] == "completed":
                break
            time.sleep(0.05)
        assert run["status"] == "completed", run


# -- submitting --------------------------------------------------------------------------------


def test_a_killed_submit_never_leaves_a_run_that_does_not_run(tmp_path: Path, url: str) -> None:
    """`minions submit` killed at random moments, then retried with the same key: each key
    has one run, and every run runs (before, 2 of 16 on SQLite and 5 of 12 on Postgres were
    stored but never queued, and the retry returned the orphan)."""
    recipe = write_ledger_recipe(tmp_path)
    RunStore(url, create=True).close()
    rng = random.Random(20)
    keys = [f"k{i}" for i in range(10)]
    for key in keys:
        command = [sys.executable, "-m", "minions", "submit", str(recipe), "-i", f"tag={key}",
                   "--idempotency-key", key, "--database-url", url]  # fmt: skip
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            process.wait(timeout=rng.uniform(0.2, 2.0))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        again = minions(*command[3:])
        assert again.returncode == 0, again.stderr
    store = RunStore(url)
    runs = asyncio.run(store.list_runs(limit=100))
    assert len(runs) == len(keys)
    with worker(url, tmp_path, "w1", tmp_path / "ledger.txt"):
        statuses = [asyncio.run(finished(store, r.run_id)) for r in runs]
    assert statuses == ["completed"] * len(keys)


async def test_an_idempotency_key_names_one_request(tmp_path: Path, url: str) -> None:
    """The same key again with other inputs, or another recipe, is refused naming the key
    (before, it silently returned the first run)."""
    recipe = write_ledger_recipe(tmp_path)
    other = write_ledger_recipe(tmp_path / "other", seconds=0.1)
    store = RunStore(url, create=True)
    first, created = await store.submit(recipe, {"tag": "x"}, idempotency_key="k")
    assert created
    again = await store.submit(recipe, {"tag": "x"}, idempotency_key="k")
    assert_type(again, Submitted)
    assert (again.run_id, again.created) == (first, False)
    assert again == (first, False)  # a pair still, as it was
    with pytest.raises(IdempotencyConflictError, match="idempotency key 'k' was used for run"):
        await store.submit(recipe, {"tag": "y"}, idempotency_key="k")
    with pytest.raises(IdempotencyConflictError):
        await store.submit(other, {"tag": "x"}, idempotency_key="k")
    done = minions("submit", str(recipe), "-i", "tag=z", "--idempotency-key", "k",
                   "--database-url", url)  # fmt: skip
    assert done.returncode == 2
    assert "idempotency key 'k'" in done.stderr
    assert "Traceback" not in done.stderr


async def test_ids_of_any_length_work_on_both_stores(tmp_path: Path, url: str) -> None:
    """A worker id, an idempotency key and approval call ids far over 200 characters
    (before, Postgres ran the side effect, then failed the run; the worker crashed)."""
    recipe = write_ledger_recipe(tmp_path)
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(recipe, {"tag": "l"}, idempotency_key="k" * 1000)
    executor = "w" * 300
    with worker(url, tmp_path, executor, tmp_path / "ledger.txt"):
        assert await finished(store, run_id) == "completed"
    assert (await store.get(run_id)).executor_id == executor


# -- workers -----------------------------------------------------------------------------------


async def test_a_frozen_worker_stands_down_when_it_wakes(tmp_path: Path) -> None:
    """A worker frozen (SIGSTOP) past the dead-worker timeout: another takes its run over;
    woken, the frozen one finds its lease gone and writes nothing (before, healthy runs ended
    FAILED with a duplicate-key error)."""
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    recipe = write_ledger_recipe(tmp_path)
    ledger = tmp_path / "ledger.txt"
    gate = tmp_path / "gate"
    gate.touch()
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(recipe, {"tag": "f"})
    with worker(url, tmp_path, "w1", ledger, GATE=str(gate)) as frozen:
        await until(lambda: len(ledger_lines(ledger)) >= 1)
        frozen.process.send_signal(signal.SIGSTOP)
        gate.unlink()  # w1 is frozen at step one; w2 goes on freely
        try:
            with worker(url, tmp_path, "w2", ledger):

                async def taken_over() -> bool:
                    return (await store.get(run_id)).executor_id == "w2"

                for _ in range(1200):
                    if await taken_over():
                        break
                    await asyncio.sleep(0.05)
                assert await taken_over()
                frozen.process.send_signal(signal.SIGCONT)
                assert await finished(store, run_id) == "completed"
        finally:
            frozen.process.send_signal(signal.SIGCONT)
    completed_once(await store.events(run_id))
    record = await store.get(run_id)
    assert [s.step_id for s in record.steps] == STEPS


async def test_a_second_worker_with_a_live_workers_id_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    recipe = write_ledger_recipe(tmp_path, seconds=0.2)
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(recipe, {"tag": "d"})
    with worker(url, tmp_path, "w1", tmp_path / "ledger.txt"):
        second = await asyncio.to_thread(
            minions, "worker", "--executor-id", "w1", "--database-url", url,
            cwd=tmp_path, LEDGER=str(tmp_path / "ledger.txt"), **WORKER_ENV,
        )  # fmt: skip
        assert second.returncode == 2, second.stderr
        assert "another worker with executor id 'w1' is running" in second.stderr
        assert await finished(store, run_id) == "completed"
    completed_once(await store.events(run_id))


LOOP = """\
id: looped
tools: [tools]
inputs: {tag: {type: string}}
steps:
  - id: items
    loop: [a, b, c, d, e, f]
    tool: mark
    params: {run: "{{ inputs.tag }}", step: "{{ loop.item }}", seconds: 0.3}
"""


async def test_loop_items_finished_before_a_kill_do_not_run_again(tmp_path: Path, url: str) -> None:
    """Each loop item is a checkpoint: a worker killed in the middle of a loop has only the
    item in flight run again (before, finished items ran again)."""
    write_ledger_recipe(tmp_path)
    recipe = tmp_path / "loop.yaml"
    recipe.write_text(LOOP)
    ledger = tmp_path / "ledger.txt"
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(recipe, {"tag": "l"})
    first = WorkerProcess(url, tmp_path, "w1", ledger)
    await until(lambda: len(ledger_lines(ledger)) >= 3)
    first.kill()
    before = [step for _, step, _ in ledger_lines(ledger)]
    with worker(url, tmp_path, "w1", ledger):
        assert await finished(store, run_id) == "completed"
    after = [step for _, step, _ in ledger_lines(ledger)]
    assert sorted(set(after)) == list("abcdef")
    for item in before[:-1]:  # finished before the kill (the last may have been in flight)
        assert after.count(item) == 1, (item, after)
    assert (await store.get(run_id)).output == [f"l:{i}" for i in "abcdef"]


async def test_an_operators_dbos_cancel_is_a_cancel(tmp_path: Path) -> None:
    """`dbos workflow cancel` on a run's workflow cancels the run (before, minions never saw
    it and showed the run `running` forever)."""
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    recipe = write_ledger_recipe(tmp_path)
    ledger = tmp_path / "ledger.txt"
    gate = tmp_path / "gate"
    gate.touch()  # the run holds after its first step's effect until the gate goes
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(recipe, {"tag": "o"})
    with worker(url, tmp_path, "w1", ledger, GATE=str(gate)):
        await until(lambda: len(ledger_lines(ledger)) >= 1)
        dbos = Path(sys.executable).parent / "dbos"
        done = await asyncio.to_thread(
            subprocess.run,
            [str(dbos), "workflow", "cancel", "-s", url, run_id],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert await finished(store, run_id) == "cancelled"
    assert len(ledger_lines(ledger)) == 1


# -- what a worker's runs share ----------------------------------------------------------------


async def test_a_workers_runs_share_what_its_models_learned(tmp_path: Path) -> None:
    """A worker keeps one model per endpoint: the second run does not pay for discovering
    again that the server refuses `json_schema` (one request fewer)."""
    from minions.runs._async import AsyncDatabase
    from minions.runs._db import Database
    from minions.runs._runner import RunExecutor
    from minions.testing import FakeOpenAIServer, FakeReply

    async with FakeOpenAIServer(
        [FakeReply.text('{"answer": "yes"}')] * 4, reject={"response_format"}
    ) as model_server:
        recipe = tmp_path / "ask.yaml"
        recipe.write_text(
            "id: ask\n"
            f"model: openai-compatible:{model_server.models[0]}@{model_server.url}\n"
            "steps:\n"
            '  - id: ask\n    goal: Yes or no?\n    output: {answer: ""}\n'
        )
        url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
        store = RunStore(url, create=True)
        async_store = AsyncDatabase(Database(url), patient=True)
        runner = RunExecutor(async_store, executor_id="w", incarnation="w")
        requests = []
        for tag in ("first", "second"):
            run_id, _ = await store.submit(recipe, idempotency_key=tag)
            before = len(model_server.chat_requests)
            await runner.execute(run_id, 1)
            assert (await store.get(run_id)).status == "completed"
            requests.append(model_server.chat_requests[before:])
        async_store.close()
    assert requests[0][0].response_format is not None  # tried, refused with a 400
    assert len(requests[1]) == len(requests[0]) - 1
    assert all(r.response_format is None for r in requests[1])


async def test_a_call_inside_a_recipe_step_waits_in_the_run_that_holds_it(tmp_path: Path) -> None:
    """A tool needing approval inside an included recipe: the durable run waits for it like
    for its own calls (before, the inner run's request went to a run that did not exist)."""
    write_ledger_recipe(tmp_path)
    (tmp_path / "inner.yaml").write_text(APPROVAL.replace("id: gated", "id: inner"))
    outer = tmp_path / "outer.yaml"
    outer.write_text(
        "id: outer\ninputs: {tag: {type: string}}\nsteps:\n"
        '  - {id: nested, recipe: inner.yaml, inputs: {tag: "{{ inputs.tag }}"}}\n'
    )
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(outer, {"tag": "n"})
    with worker(url, tmp_path, "w1", tmp_path / "ledger.txt"):
        for _ in range(1200):
            record = await store.get(run_id)
            if record.status == "waiting":
                break
            await asyncio.sleep(0.05)
        assert record.status == "waiting", record
        [waiting] = record.approvals
        assert waiting.tool == "mark"
        await store.approve(run_id)
        assert await finished(store, run_id) == "completed"
    assert [step for _, step, _ in ledger_lines(tmp_path / "ledger.txt")] == ["ship"]


async def test_dbos_resume_and_fork_of_a_run_are_refused_saying_how(tmp_path: Path) -> None:
    """DBOS's own `workflow resume` (of a run cancelled while queued: DBOS resumes only
    cancelled workflows) and `workflow fork` do not run a run behind minions' back: each
    workflow ends in ERROR naming the minions command to use."""
    from dbos import DBOSClient

    recipe = write_ledger_recipe(tmp_path)
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    ledger = tmp_path / "ledger.txt"
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(recipe, {"tag": "d"})
    await store.cancel(run_id)
    dbos = str(Path(sys.executable).parent / "dbos")
    client = DBOSClient(system_database_url=url)

    def dbos_error(workflow: str) -> str:
        status = client.retrieve_workflow(workflow).get_status()
        return f"{status.status}: {status.error}"

    with worker(url, tmp_path, "w1", ledger):
        for command in (["resume", run_id], ["fork", run_id, "-f", "forked"]):
            done = await asyncio.to_thread(
                subprocess.run,
                [dbos, "workflow", *command, "-s", url],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
        await until(lambda: dbos_error(run_id).startswith("ERROR"))
        await until(lambda: dbos_error("forked").startswith("ERROR"))
    assert f"`minions runs resume {run_id}`" in dbos_error(run_id)
    assert f"is a fork of run {run_id}" in dbos_error("forked")
    assert (await store.get(run_id)).status == "cancelled"
    assert ledger_lines(ledger) == []
    client.destroy()


async def test_a_runs_end_is_stored_only_with_its_status(tmp_path: Path) -> None:
    """The terminal event is written in the commit that ends the run, never by the periodic
    flush before it: a holder killed between the two left a log that ended (run_completed)
    while the run went on elsewhere, and two terminal events (seen in the proof test)."""
    import time as clock

    from runs_helpers import insert_run

    from minions.events import RunCompleted, StepStarted
    from minions.runs import _events, _leases, _runs
    from minions.runs._async import AsyncDatabase
    from minions.runs._db import Database
    from minions.runs._runner import RunRecorder

    store = Database(f"sqlite:///{tmp_path / 'minions.db'}", create=True)
    insert_run(store, "r")
    start = _leases.claim(
        store, "r", attempt=1, holder="h", executor_id="e", lease_until=1e12, now=0.0
    )
    assert isinstance(start, _leases.Start)
    recorder = RunRecorder(AsyncDatabase(store), start.lease, last=0, interval=0.0)
    now = clock.time()
    recorder.on_event(StepStarted(run_id="r", step_id="a", seq=1, timestamp=now))
    recorder.on_event(RunCompleted(run_id="r", seq=2, timestamp=now))
    await recorder._flush()
    assert [e.kind for e in _events.after(store, "r")] == ["step_started"]
    assert _runs.head(store, "r") == _runs.Head(status="running", last_seq=1)
    assert await recorder.close(status="completed", finished_at=now)
    assert [e.kind for e in _events.after(store, "r")] == ["step_started", "run_completed"]
    assert _runs.head(store, "r") == _runs.Head(status="completed", last_seq=2)
    store.close()


async def test_a_worker_runs_at_most_its_own_concurrency_whatever_the_queue_hands_it(
    tmp_path: Path,
) -> None:
    """DBOS hands each worker of a store as many runs as the last worker started asked for: a
    worker started with fewer runs its own number at a time, the others wait in it unclaimed
    (before, it ran all it was handed)."""
    from minions import Prompt, RunSettings
    from minions.runs._async import AsyncDatabase
    from minions.runs._db import Database
    from minions.runs._runner import RunExecutor
    from minions.testing import FunctionModel

    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    store = RunStore(url, create=True)
    recipe = tmp_path / "one.yaml"
    recipe.write_text("id: one\nsteps:\n  - {id: only, goal: go}\n")
    ids = [(await store.submit(recipe))[0] for _ in range(3)]
    calls, two, go = 0, asyncio.Event(), asyncio.Event()

    async def answer(_: Prompt) -> str:
        nonlocal calls
        calls += 1
        if calls == 2:
            two.set()
        await go.wait()
        return "ok"

    async_store = AsyncDatabase(Database(url), patient=True)
    settings = RunSettings(model=FunctionModel(answer, name="held"))
    runner = RunExecutor(
        async_store, executor_id="w", incarnation="w", settings=settings, concurrency=2
    )
    runs = asyncio.gather(*(runner.execute(run_id, 1) for run_id in ids))
    await asyncio.wait_for(two.wait(), 60)
    # Two runs call the model; the third, handed over too, waits for a place unclaimed (a
    # runner holds a run from the moment it starts to claim it).
    assert len(runner.held) == 2
    statuses = sorted([(await store.get(run_id)).status for run_id in ids])
    assert statuses == ["queued", "running", "running"]
    go.set()
    await runs
    assert [(await store.get(run_id)).status for run_id in ids] == ["completed"] * 3
    assert calls == 3
    async_store.close()
    store.close()


async def test_a_run_waiting_in_a_busy_worker_is_handed_back_to_one_with_a_place(
    tmp_path: Path,
) -> None:
    """DBOS hands a worker one run beyond its --concurrency, to start the moment a place
    frees instead of at the queue's next poll. It waits there while no other worker has a
    place; once one has, it is handed back to the queue (its next attempt) and that worker
    runs it; the busy worker does not take it again (its delivery keeps its place in DBOS's
    count until a place frees)."""
    import sqlite3

    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    recipe = write_ledger_recipe(tmp_path)
    ledger, gate = tmp_path / "ledger.txt", tmp_path / "gate"
    gate.touch()
    store = RunStore(url, create=True)
    held, _ = await store.submit(recipe, {"tag": "held"})
    busy = ("--concurrency", "1")
    with worker(url, tmp_path, "w1", ledger, *busy, GATE=str(gate), MINIONS_HAND_BACK_AFTER="0.1"):
        await until(lambda: len(ledger_lines(ledger)) >= 1)  # w1's one place: held, at step one
        waiting, _ = await store.submit(recipe, {"tag": "waiting"})

        def handed_to(executor: str) -> bool:
            with sqlite3.connect(tmp_path / "store" / "minions.db") as db:
                row = db.execute(
                    "SELECT status, executor_id FROM workflow_status WHERE workflow_uuid = ?",
                    (waiting,),
                ).fetchone()
            return bool(row == ("PENDING", executor))

        await until(lambda: handed_to("w1"))  # the one beyond its place: it waits in w1
        await asyncio.sleep(1)  # ten looks for a worker with a place: there is none
        assert ((await store.get(waiting)).status, (await store.get(waiting)).attempt) == (
            "queued",
            1,
        )
        with worker(url, tmp_path, "w2", ledger, *busy):
            assert await finished(store, waiting) == "completed"
            assert (await store.get(held)).status == "running"
        gate.unlink()
        assert await finished(store, held) == "completed"
    record = await store.get(waiting)
    assert (record.executor_id, record.attempt) == ("w2", 2)  # handed back once, not again
    assert [step for run, step, _ in ledger_lines(ledger) if run == "waiting"] == STEPS
    said = await store.events(waiting)
    completed_once(said)
    # Its log says it was handed back, before it started in w2.
    assert [e.kind for e in said][:2] == ["run_handed_back", "run_started"]
    back = said[0]
    assert isinstance(back, RunHandedBack)
    assert (back.executor_id, back.reason, back.attempt) == ("w1", "busy", 2)


async def test_a_place_free_elsewhere_is_counted_from_dbos_on_both_stores(
    tmp_path: Path, url: str
) -> None:
    """A waiting run is handed back only to a live worker with a place free: fewer of the
    queue's workflows handed to it and unfinished than its places (DBOS's table, the same
    query on SQLite and Postgres)."""
    import sqlalchemy as sa

    from minions.runs import _workers
    from minions.runs._db import Database
    from minions.runs._queue import QUEUE, Queue

    recipe = write_ledger_recipe(tmp_path)
    store = RunStore(url, create=True)
    await store.submit(recipe, {"tag": "t"})  # its workflow: ENQUEUED
    raw = Database(url)
    _workers.register(raw, "other", incarnation="i", version="v", host="h", pid=1)

    def room(places: int, me: str = "me") -> bool:
        return _workers.room_elsewhere(raw, me, queue=QUEUE, places=places, now=time.time())

    assert room(1)
    assert not room(1, me="other")
    table = "dbos.workflow_status" if raw.postgres else "workflow_status"
    with raw.begin() as db:  # handed to "other" by DBOS's queue
        db.execute(
            sa.text(f"UPDATE {table} SET status = 'PENDING', executor_id = 'other'"),
        )
    assert not room(1)
    assert room(2)
    _workers.stopped(raw, "other", incarnation="i")
    assert not room(2)  # a stopped worker has no place
    raw.close()
    Queue(url).close()
    store.close()


def test_a_hand_back_is_a_compare_and_set_on_the_runs_attempt(tmp_path: Path) -> None:
    """A run is handed back only while the attempt handed over is its current one and it is
    queued: a cancel, or a takeover that queued a newer attempt, wins."""
    from minions.runs import _runs
    from minions.runs._db import Database

    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    recipe = write_ledger_recipe(tmp_path)
    store = RunStore(url, create=True)
    run_id, _ = asyncio.run(store.submit(recipe, {"tag": "t"}))
    queued: list[tuple[str, int]] = []

    def hand_back(attempt: int) -> int | None:
        record = _runs.requeue(
            Database(url),
            run_id,
            statuses=("queued",),
            epoch=None,
            attempt=attempt,
            recovery=False,
            enqueue=lambda _db, run, number: queued.append((run, number)),
        )
        return None if record is None else record.attempt

    assert hand_back(2) is None  # not its current attempt
    assert hand_back(1) == 2
    assert hand_back(1) is None  # handed back already
    asyncio.run(store.cancel(run_id))
    assert hand_back(2) is None  # cancelled
    assert queued == [(run_id, 2)]
    store.close()


async def test_a_run_delivered_twice_to_one_worker_runs_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DBOS may deliver a run's attempt again to the worker that runs it (its recovery at a
    start): the second delivery does nothing (before, it took the run over from the first,
    which had done its step's effect: seen once in the proof test)."""
    from minions.runs._async import AsyncDatabase
    from minions.runs._db import Database
    from minions.runs._runner import RunExecutor

    ledger = tmp_path / "ledger.txt"
    monkeypatch.setenv("LEDGER", str(ledger))
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(write_ledger_recipe(tmp_path), {"tag": "t"})
    async_store = AsyncDatabase(Database(url), patient=True)
    runner = RunExecutor(async_store, executor_id="w", incarnation="w")
    await asyncio.gather(runner.execute(run_id, 1), runner.execute(run_id, 1))
    async_store.close()
    assert (await store.get(run_id)).status == "completed"
    assert [step for _, step, _ in ledger_lines(ledger)] == STEPS


def test_processes_opening_a_new_postgres_store_at_once_make_its_tables_once(
    postgres: str,
) -> None:
    """Two workers started together on a fresh database: each opening makes the tables or
    finds them made (Postgres refused the second's types: pg_type_typname_nsp_index)."""
    import threading
    import uuid

    from postgres import fresh_database

    from minions.runs._db import Database

    url = fresh_database(postgres, f"open{uuid.uuid4().hex[:10]}")
    start = threading.Barrier(4)
    failures: list[BaseException] = []

    def open_store() -> None:
        start.wait()
        try:
            Database(url, create=True).close()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []
