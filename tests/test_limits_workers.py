"""The proof of limits per model endpoint, and of what endpoints taught, over worker processes
(`minions worker --limits FILE`) on one store: a server that counts the requests it has in
flight never sees more than the limit; a 429 with ``Retry-After`` seen by one run holds the
others' requests; the second and later runs through any worker make no discovery calls on a
server that ignores tools."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from runs_helpers import WorkerProcess, finished, overlapping_server, watched, worker

from minions.runs import RunStore
from minions.testing import FakeOpenAIServer, FakeReply, FakeRequest

ONE_STEP = "id: hello\ninputs: {tag: {type: string}}\nsteps:\n  - {id: hi, goal: 'say hi {{ inputs.tag }}'}\n"


def limited(limits: Path) -> type[WorkerProcess]:
    """`minions worker --limits FILE`."""
    return type("LimitedWorker", (WorkerProcess,), {"args": ("--limits", str(limits))})


def setup(
    folder: Path, server: FakeOpenAIServer, recipe: str, limits: str
) -> tuple[Path, Path, dict[str, str]]:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "recipe.yaml"
    path.write_text(recipe)
    file = folder / "limits.yaml"
    file.write_text(limits)
    env = {
        "MINIONS_MODEL": f"openai-compatible:fake-model@{server.url}",
        "OPENAI_API_KEY": "sk-test",
    }
    return path, file, env


async def test_three_workers_never_send_more_than_max_concurrent(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with overlapping_server() as server:
        recipe, limits, env = setup(
            tmp_path,
            server,
            ONE_STEP,
            f'endpoints:\n  - {{match: "{server.url}", max_concurrent: 2}}\n',
        )
        store = RunStore(url, create=True)
        run_ids = [(await store.submit(recipe, {"tag": str(n)}))[0] for n in range(12)]
        ledger = tmp_path / "ledger.txt"
        kind = limited(limits)
        with (
            watched(kind(url, tmp_path, "w1", ledger, **env)),
            watched(kind(url, tmp_path, "w2", ledger, **env)),
            watched(kind(url, tmp_path, "w3", ledger, **env)),
        ):
            statuses = [await finished(store, run_id, within=120) for run_id in run_ids]
        events = [await store.events(run_id) for run_id in run_ids]
        await store.aclose()
    assert statuses == ["completed"] * 12
    assert len(server.chat_requests) >= 12  # a run taken over from a slow worker asks again
    assert server.max_in_flight == 2
    # Twelve runs over three workers of four runs each: some waited, and said so.
    assert any(e.kind == "model_call_waiting" for run in events for e in run)


async def test_a_429_seen_by_one_run_holds_the_other_runs_of_every_worker(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    refused_at: list[float] = []
    arrived: list[tuple[float, str]] = []
    refused = threading.Event()

    def reply(request: FakeRequest) -> FakeReply:
        now = time.monotonic()
        text = str(request.messages[-1].get("content"))
        arrived.append((now, text))
        if "first" in text and not refused_at:
            refused_at.append(now)
            refused.set()
            return FakeReply.rate_limit(retry_after=2)
        return FakeReply.text("ok")

    with FakeOpenAIServer(reply) as server:
        recipe, limits, env = setup(
            tmp_path,
            server,
            ONE_STEP,
            f'endpoints:\n  - {{match: "{server.url}", requests_per_minute: 1000}}\n',
        )
        store = RunStore(url, create=True)
        ledger = tmp_path / "ledger.txt"
        kind = limited(limits)
        with (
            watched(kind(url, tmp_path, "w1", ledger, **env)),
            watched(kind(url, tmp_path, "w2", ledger, **env)),
        ):
            first, _ = await store.submit(recipe, {"tag": "first"})
            await asyncio.to_thread(refused.wait, 60)
            others = [(await store.submit(recipe, {"tag": f"other{n}"}))[0] for n in range(6)]
            statuses = [await finished(store, r, within=120) for r in [first, *others]]
            waited = [
                e for r in others for e in await store.events(r) if e.kind == "model_call_waiting"
            ]
        await store.aclose()
    assert statuses == ["completed"] * 7
    later = [at for at, text in arrived if "other" in text]
    assert len(later) == 6
    # Every other run's request came after the pause (the server's own clock).
    assert min(later) >= refused_at[0] + 1.9
    assert waited
    assert {e.reason for e in waited} == {"retry_after"}


CAPABILITY = """\
id: sum
inputs: {tag: {type: string}}
steps:
  - id: total
    goal: "Add 2 and 3 ({{ inputs.tag }})."
    tools: [current_datetime]
    output: {total: 0}
"""


def ignores_tools() -> FakeOpenAIServer:
    """A server that ignores tools, as llama.cpp with a template without tool support: asked
    for the output tool, the model answers in prose; asked for native JSON, it gives it."""

    def reply(request: FakeRequest) -> FakeReply:
        if request.response_format is not None:
            return FakeReply.text('{"total": 5}')
        return FakeReply.text("Five.")

    return FakeOpenAIServer(reply, quirks={"ignores_tools"})


def discovery(server: FakeOpenAIServer, since: int) -> int:
    """The chat requests since the `since`-th that asked for another mode than the one that
    works (native JSON)."""
    return sum(r.response_format is None for r in server.chat_requests[since:])


async def test_later_runs_through_any_worker_make_no_discovery_calls(tmp_path: Path) -> None:
    """A mode an endpoint ignores (prose, not a refusal on the wire) is each run's own lesson
    until `demote_after_runs` (3) runs saw it ignored; then no run of any worker asks for it
    again, and the store says on which runs' evidence."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with ignores_tools() as server:
        recipe, _, env = setup(tmp_path, server, CAPABILITY, "endpoints: []\n")
        store = RunStore(url, create=True)
        ledger = tmp_path / "ledger.txt"
        with worker(url, tmp_path, "w1", ledger, **env):
            taught = []
            for n in range(3):
                run, _ = await store.submit(recipe, {"tag": f"teach-{n}"})
                assert await finished(store, run) == "completed"
                taught.append(run)
                # Each of them: the tool rung, ignored twice, then native JSON.
                assert discovery(server, 0) == 2 * (n + 1)
            learned = len(server.chat_requests)
            second = [(await store.submit(recipe, {"tag": f"w1-{n}"}))[0] for n in range(3)]
            assert [await finished(store, r) for r in second] == ["completed"] * 3
        assert discovery(server, learned) == 0
        assert len(server.chat_requests) >= learned + 3
        known = await store.endpoints()
        assert [(e.base_url, e.model, e.output_mode) for e in known] == [
            (server.url, "fake-model", "json_schema")
        ]
        assert set(known[0].rejected) == {"tool", "tools"}
        assert {(x.feature, x.cause, x.runs) for x in known[0].lessons} == {
            ("tool", "ignored", tuple(taught)),
            ("tools", "ignored", tuple(taught)),
        }
        before = len(server.chat_requests)
        with worker(url, tmp_path, "w2", ledger, **env):  # another worker, started later
            third = [(await store.submit(recipe, {"tag": f"w2-{n}"}))[0] for n in range(3)]
            assert [await finished(store, r) for r in third] == ["completed"] * 3
        assert discovery(server, before) == 0
        outputs = [(await store.get(r)).output for r in [*taught, *second, *third]]
        await store.aclose()
    assert outputs == [{"total": 5}] * 9
