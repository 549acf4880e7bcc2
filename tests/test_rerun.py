"""Reruns from a step and diffs of runs, on SQLite and Postgres: a 6-step recipe with a ledger
tool (its side effects logged by idempotency key), parallel branches, a loop, an agent step
and an approval, rerun from each step in turn (with inputs changed and outputs set by hand);
the rule of what runs again as a property over random graphs; the CLI and the REST API."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runs_helpers import (
    TOOLS,
    finished,
    ledger_lines,
    marking_model,
    minions,
    run_here,
    until,
    worker,
)
from service_helpers import app_in_thread, auth

from minions.errors import RerunError, RunStateError, UnknownRunError
from minions.events import RerunPlanned, StepReused
from minions.models import Model
from minions.recipes import parse_recipe
from minions.runs import RunRecord, RunStore, StepRecord
from minions.runs._rerun import plan_rerun, reexecuted
from minions.service import ServiceConfig, create_app

pytestmark = pytest.mark.slow

PROOF = """\
id: proof
tools: [tools]
inputs:
  tag: {type: string}
  extra: {type: string, default: x}
steps:
  - {id: fetch, tool: mark, params: {run: "{{ inputs.tag }}", step: fetch}}
  - {id: left, depends_on: [fetch], tool: mark, params: {run: "{{ inputs.tag }}", step: left}}
  - id: right
    depends_on: [fetch]
    tools: [mark]
    goal: "mark run {{ inputs.tag }} step right"
  - id: each
    depends_on: [left]
    loop: [i1, i2]
    tool: mark
    params: {run: "{{ inputs.tag }}", step: "each-{{ loop.item }}"}
  - id: ship
    depends_on: [each, right]
    tool: mark
    params: {run: "{{ left.output }}", step: ship}
    requires_approval: true
  - id: report
    depends_on: [ship]
    tool: mark
    params: {run: "{{ inputs.extra }}", step: report}
"""
STEPS = ["fetch", "left", "right", "each", "ship", "report"]
DOWNSTREAM = {
    "fetch": {"left", "right", "each", "ship", "report"},
    "left": {"each", "ship", "report"},
    "right": {"ship", "report"},
    "each": {"ship", "report"},
    "ship": {"report"},
    "report": set(),
}


def write_proof(folder: Path, text: str = PROOF, name: str = "proof.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tools.py").write_text(TOOLS)
    path = folder / name
    path.write_text(text)
    return path


async def execute(store: RunStore, url: str, run_id: str, model: Model) -> RunRecord:
    """Run a queued run in this process, approving every call it waits for (a run parked
    at a call runs again, from its checkpoints, once the call is approved)."""
    while True:
        record = await store.get(run_id)
        task = asyncio.create_task(run_here(url, run_id, record.attempt, model=model))
        while not task.done():
            for approval in (await store.get(run_id)).approvals:
                if approval.decided_at is None:
                    await store.approve(run_id, approval.call_id)
            await asyncio.wait({task}, timeout=0.05)
        await task
        record = await store.get(run_id)
        if record.terminal:
            return record
        for approval in record.approvals:
            if approval.decided_at is None:
                await store.approve(run_id, approval.call_id)


async def executed(url: str, recipe: Path | None = None, *, run_id: str = "") -> str:
    """Submit a run of `recipe` (tag "a"), or take the queued run `run_id`; run it in this
    process with the ledger's model; its id."""
    store = RunStore(url, create=True)
    with marking_model() as server:
        if recipe is not None:
            run_id, _ = await store.submit(recipe, {"tag": "a"})
        await execute(store, url, run_id, server.model())
    await store.aclose()
    return run_id


def effects(ledger: Path, run_id: str) -> list[tuple[str, str]]:
    """The run's side effects: (the `run` argument, the step) of each ledger line."""
    # A sub-recipe's steps are keyed by its inner run, ``RUN.step/...``.
    return [
        (run, step)
        for run, step, key in ledger_lines(ledger)
        if key.split("/")[0].partition(".")[0] == run_id
    ]


def steps_of(found: list[tuple[str, str]]) -> Counter[str]:
    return Counter(step.partition("-")[0] for _, step in found)


def expected(steps: set[str]) -> Counter[str]:
    return Counter({s: 2 if s == "each" else 1 for s in steps})


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.txt"
    monkeypatch.setenv("LEDGER", str(path))
    return path


async def test_a_rerun_from_each_step_runs_only_it_and_what_follows(
    tmp_path: Path, url: str, ledger: Path
) -> None:
    recipe = write_proof(tmp_path)
    store = RunStore(url, create=True)
    with marking_model() as server:
        model = server.model()
        parent, _ = await store.submit(recipe, {"tag": "a"})
        first = await execute(store, url, parent, model)
        assert first.status == "completed"
        assert steps_of(effects(ledger, parent)) == expected(set(STEPS))
        for step in STEPS:
            calls = len(server.chat_requests)
            plan = await store.rerun(parent, from_step=step)
            again = {step} | DOWNSTREAM[step]
            assert set(plan.rerun) == again
            assert set(plan.reused) == set(STEPS) - again
            record = await execute(store, url, plan.run_id, model)
            assert record.status == "completed", record.error
            assert (record.parent_run_id, record.from_step) == (parent, step)
            assert record.output == first.output
            # Side effects only for the chosen step and what follows it.
            assert steps_of(effects(ledger, plan.run_id)) == expected(again), step
            # Reused steps: no model call, no new usage, their original usage kept aside.
            if "right" not in again:
                assert len(server.chat_requests) == calls
                assert record.usage.get("calls", 0) == 0
            else:
                assert len(server.chat_requests) > calls
            shown = {s.step_id: s for s in record.steps}
            for name in set(STEPS) - again:
                assert shown[name].status == "reused"
                assert shown[name].reused_from == parent
                assert not any(shown[name].usage.values())
                assert shown[name].model_calls == 0
            if "right" not in again:
                assert shown["right"].reused_usage.get("calls", 0) >= 1
            for name in again:
                assert shown[name].status == "completed"
            events = await store.events(plan.run_id)
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
            assert events[0].kind == "run_started"
            planned = events[1]
            assert isinstance(planned, RerunPlanned)
            assert (planned.parent_run_id, planned.from_step) == (parent, step)
            reused = [e.step_id for e in events if isinstance(e, StepReused)]
            assert set(reused) == set(STEPS) - again
            assert not [e for e in events if e.kind == "approval_requested"] or "ship" in again
    await store.aclose()


async def test_inputs_and_outputs_set_by_hand_reach_what_runs_again(
    tmp_path: Path, url: str, ledger: Path
) -> None:
    recipe = write_proof(tmp_path)
    store = RunStore(url, create=True)
    with marking_model() as server:
        model = server.model()
        parent, _ = await store.submit(recipe, {"tag": "a"})
        await execute(store, url, parent, model)

        # An output set by hand: what follows it runs again and sees it.
        plan = await store.rerun(parent, from_step="report", outputs={"left": "edited"})
        assert set(plan.rerun) == {"each", "ship", "report"}
        edited = await execute(store, url, plan.run_id, model)
        assert ("edited", "ship") in effects(ledger, plan.run_id)
        assert steps_of(effects(ledger, plan.run_id)) == expected({"each", "ship", "report"})
        [left] = [s for s in edited.steps if s.step_id == "left"]
        assert (left.status, left.output) == ("reused", "edited")
        reused = [e for e in await store.events(plan.run_id) if isinstance(e, StepReused)]
        assert [e.edited for e in reused if e.step_id == "left"] == [True]

        # A rerun of a rerun: the edited output is reused as it was set; the source of a
        # reused step is the run that ran it.
        again = await store.rerun(plan.run_id, from_step="report")
        assert again.rerun == ("report",)
        record = await execute(store, url, again.run_id, model)
        shown = {s.step_id: s for s in record.steps}
        assert shown["left"].output == "edited"
        assert shown["left"].reused_from == parent
        assert shown["ship"].reused_from == plan.run_id
        assert steps_of(effects(ledger, again.run_id)) == expected({"report"})

        # Changed inputs: the steps whose rendered templates change run again, and say so.
        changed = await store.rerun(parent, from_step="left", inputs={"extra": "z"})
        assert changed.changed == {"report": "inputs"}
        await execute(store, url, changed.run_id, model)
        assert ("z", "report") in effects(ledger, changed.run_id)
        retagged = await store.rerun(parent, from_step="report", inputs={"tag": "b"})
        assert set(retagged.rerun) == set(STEPS)
        assert retagged.changed == dict.fromkeys(("fetch", "left", "right", "each"), "inputs")
        await execute(store, url, retagged.run_id, model)
        [planned] = [e for e in await store.events(retagged.run_id) if isinstance(e, RerunPlanned)]
        assert dict(planned.changed) == retagged.changed
        assert {run for run, _ in effects(ledger, retagged.run_id)} >= {"b"}

        # What cannot be done is refused, naming why; nothing is queued.
        with pytest.raises(RerunError, match="'ship' runs again"):
            await store.rerun(parent, from_step="left", outputs={"ship": "x"})
        with pytest.raises(RerunError, match="no step 'nope'"):
            await store.rerun(parent, from_step="nope")
        with pytest.raises(UnknownRunError):
            await store.rerun("no-such-run", from_step="left")
        queued, _ = await store.submit(recipe, {"tag": "q"})
        with pytest.raises(RunStateError, match="only an ended run is rerun"):
            await store.rerun(queued, from_step="left")
    await store.aclose()


async def test_a_rerun_killed_mid_way_goes_on_without_reusing_anything_twice(
    tmp_path: Path, url: str, ledger: Path
) -> None:
    recipe = write_proof(tmp_path)
    store = RunStore(url, create=True)
    with marking_model() as server:
        parent, _ = await store.submit(recipe, {"tag": "a"})
        await execute(store, url, parent, server.model())
    plan = await store.rerun(parent, from_step="report")
    gate = tmp_path / "gate"
    gate.touch()  # the report's effect is held while the gate exists
    first = worker(url, tmp_path, "w1", ledger, GATE=str(gate))
    process = first.__enter__()
    await until(lambda: bool(effects(ledger, plan.run_id)))
    for _ in range(600):  # and its events up to the tool call are stored
        if "tool_call_started" in [e.kind for e in await store.events(plan.run_id)]:
            break
        await asyncio.sleep(0.05)
    process.kill()
    gate.unlink()
    with worker(url, tmp_path, "w1", ledger):
        assert await finished(store, plan.run_id) == "completed"
    events = await store.events(plan.run_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    kinds = [e.kind for e in events]
    assert (kinds.count("run_started"), kinds.count("rerun_planned")) == (1, 1)
    reused = Counter(e.step_id for e in events if isinstance(e, StepReused))
    assert reused == Counter(set(STEPS) - {"report"})
    assert {step for _, step in effects(ledger, plan.run_id)} == {"report"}
    record = await store.get(plan.run_id)
    assert [s.status for s in record.steps].count("reused") == 5


ROUTED = """\
id: routed
tools: [tools]
inputs:
  tag: {type: string}
  path: {type: string, default: left}
steps:
  - id: decide
    tool: mark
    params: {run: "{{ inputs.tag }}", step: decide}
    next:
      - {step: go_left, when: "inputs.path == 'left'"}
      - {step: go_right, when: "inputs.path == 'right'"}
  - {id: go_left, tool: mark, params: {run: "{{ inputs.tag }}", step: go_left}}
  - {id: go_right, tool: mark, params: {run: "{{ inputs.tag }}", step: go_right}}
  - {id: tail, depends_on: [go_left], tool: mark, params: {run: "{{ inputs.tag }}", step: tail}}
"""


async def test_routing_decisions_are_reused_unless_their_conditions_change(
    tmp_path: Path, ledger: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    recipe = write_proof(tmp_path, ROUTED, "routed.yaml")
    store = RunStore(url, create=True)
    with marking_model() as server:
        parent, _ = await store.submit(recipe, {"tag": "a"})
        await execute(store, url, parent, server.model())
        assert [step for _, step in effects(ledger, parent)] == ["decide", "go_left", "tail"]
        # The routing decision is reused: the unchosen branch stays unchosen, unrun.
        plan = await store.rerun(parent, from_step="tail")
        record = await execute(store, url, plan.run_id, server.model())
        assert [step for _, step in effects(ledger, plan.run_id)] == ["tail"]
        assert record.status == "completed"
        kinds = [e.kind for e in await store.events(plan.run_id)]
        assert "routing_decided" not in kinds
        # An input its condition reads: the step that routes runs again, and routes anew.
        other = await store.rerun(parent, from_step="tail", inputs={"path": "right"})
        assert other.changed == {"decide": "inputs"}
        await execute(store, url, other.run_id, server.model())
        assert [step for _, step in effects(ledger, other.run_id)] == ["decide", "go_right"]
    await store.aclose()


async def test_a_sub_recipe_before_the_chosen_step_is_reused_whole(
    tmp_path: Path, ledger: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    write_proof(
        tmp_path,
        "id: sub\ntools: [tools]\ninputs: {tag: {type: string}}\nsteps:\n"
        '  - {id: one, tool: mark, params: {run: "{{ inputs.tag }}", step: sub-one}}\n'
        '  - {id: two, depends_on: [one], tool: mark, params: {run: "{{ inputs.tag }}", '
        "step: sub-two}}\n",
        "sub.yaml",
    )
    recipe = write_proof(
        tmp_path,
        "id: outer\ntools: [tools]\ninputs: {tag: {type: string}}\nsteps:\n"
        '  - {id: inner, recipe: sub.yaml, inputs: {tag: "{{ inputs.tag }}"}}\n'
        '  - {id: last, depends_on: [inner], tool: mark, params: {run: "{{ inputs.tag }}", '
        "step: last}}\n",
        "outer.yaml",
    )
    store = RunStore(url, create=True)
    with marking_model() as server:
        parent, _ = await store.submit(recipe, {"tag": "a"})
        first = await execute(store, url, parent, server.model())
        assert first.status == "completed", first.error
        assert [step for _, step in effects(ledger, parent)] == ["sub-one", "sub-two", "last"]
        plan = await store.rerun(parent, from_step="last")
        record = await execute(store, url, plan.run_id, server.model())
    assert record.status == "completed"
    assert [step for _, step in effects(ledger, plan.run_id)] == ["last"]
    assert {s.step_id: s.status for s in record.steps}["inner"] == "reused"
    await store.aclose()


STRUCTURED = """\
id: structured
inputs: {topic: {type: string}}
steps:
  - id: outline
    goal: "outline {{ inputs.topic }}"
    output: {type: object, properties: {title: {type: string}}, required: [title]}
  - {id: draft, depends_on: [outline], goal: "draft {{ outline.output.title }}"}
"""


async def test_an_output_set_by_hand_is_checked_against_the_steps_schema(
    tmp_path: Path, ledger: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    recipe = write_proof(tmp_path, STRUCTURED, "structured.yaml")
    store = RunStore(url, create=True)

    def reply(request: Any) -> Any:
        from minions.testing import FakeReply

        text = json.dumps(request.messages)
        return FakeReply.text('{"title": "T"}' if "outline" in text else "a draft")

    from minions.testing import FakeOpenAIServer

    with FakeOpenAIServer(reply) as server:
        parent, _ = await store.submit(recipe, {"topic": "x"})
        assert (await execute(store, url, parent, server.model())).status == "completed"
        with pytest.raises(RerunError, match="does not match its schema"):
            await store.rerun(parent, from_step="draft", outputs={"outline": {"nope": 1}})
        plan = await store.rerun(parent, from_step="draft", outputs={"outline": {"title": "U"}})
        calls = len(server.chat_requests)
        record = await execute(store, url, plan.run_id, server.model())
        assert len(server.chat_requests) == calls + 1  # the draft only
        assert "draft U" in json.dumps(server.chat_requests[-1].messages)
        assert record.status == "completed"
    await store.aclose()


async def test_a_new_recipe_version_runs_the_steps_it_changed(tmp_path: Path, ledger: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    recipe = write_proof(tmp_path)
    store = RunStore(url, create=True)
    with marking_model() as server:
        parent, _ = await store.submit(recipe, {"tag": "a"})
        await execute(store, url, parent, server.model())
        newer = write_proof(tmp_path, PROOF.replace("step: left}", "step: left2}"), "proof-v2.yaml")
        plan = await store.rerun(parent, from_step="report", recipe=newer)
        assert plan.changed == {"left": "definition"}
        assert set(plan.rerun) == {"left", "each", "ship", "report"}
        await execute(store, url, plan.run_id, server.model())
        assert ("a", "left2") in effects(ledger, plan.run_id)
        same = await store.rerun(parent, from_step="report", recipe=recipe)
        assert same.rerun == ("report",)
    await store.aclose()


def previewed(parent: str) -> dict[str, Any]:
    """The preview of the rerun of `parent` from ``report`` with ``left`` set and input
    ``extra`` changed (the API's and the CLI's ``--dry-run --json``)."""
    return {
        "parent_run_id": parent,
        "from_step": "report",
        "reused": ["fetch", "left", "right"],
        "rerun": ["each", "ship", "report"],
        "changed": {"report": "inputs"},
        "cache": False,
        "editable": ["fetch", "left", "right"],
    }


def test_the_cli_reruns_and_diffs(tmp_path: Path, ledger: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    recipe = write_proof(tmp_path)

    parent = asyncio.run(executed(url, recipe))
    edit = ("--from", "report", "--set", 'left="edited"', "-i", "extra=y", "--database-url", url)
    # A dry run says what the rerun would do, as the API's preview does, and queues nothing.
    planned = minions("runs", "rerun", parent, *edit, "--dry-run", "--json")
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout) == previewed(parent)
    said = minions("runs", "rerun", parent, *edit, "--dry-run")
    assert said.returncode == 0, said.stderr
    assert said.stdout.splitlines() == [
        f"a rerun of {parent} from report (dry run: nothing queued)",
        "reuses fetch, left, right; runs each, ship, report",
        "step report runs again: its inputs changed",
        "--set may replace the output of fetch, left, right",
    ]
    with sqlite3.connect(tmp_path / "store" / "minions.db") as db:
        assert db.execute("SELECT run_id FROM minions_runs").fetchall() == [(parent,)]
    done = minions("runs", "rerun", parent, *edit)
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip()
    assert len(run_id) == 32
    assert "reuses fetch, left, right; runs each, ship, report" in done.stderr
    assert "step report runs again: its inputs changed" in done.stderr

    asyncio.run(executed(url, run_id=run_id))
    shown = minions("runs", "show", run_id, "--database-url", url)
    assert f"rerun of {parent} from report" in shown.stdout
    # Its steps in the order they happened: the reused ones first (said when the rerun began).
    rows = [line.split()[:3] for line in shown.stdout.splitlines() if "│" in line]
    assert [(r[0], r[2]) for r in rows[:3]] == [
        ("fetch", "reused"),
        ("left", "reused"),
        ("right", "reused"),
    ]
    diffed = minions("runs", "diff", parent, run_id, "--json", "--database-url", url)
    assert diffed.returncode == 0, diffed.stderr
    data = json.loads(diffed.stdout)
    assert data["first_divergence"] == "left"
    by_step = {s["step_id"]: s for s in data["steps"]}
    assert by_step["left"]["changes"] == [{"path": "$", "a": "a:left", "b": "edited"}]
    assert not by_step["fetch"]["diverges"]
    assert by_step["fetch"]["reused"] == [False, True]
    text = minions("runs", "diff", parent, run_id, "--database-url", url)
    assert "first divergence: left" in text.stdout
    bad = minions(
        "runs", "rerun", parent, "--from", "report", "--set", "left=oops", "--database-url", url
    )
    assert bad.returncode == 2
    assert "not JSON" in bad.stderr
    refused = minions("runs", "rerun", parent, "--from", "nope", "--database-url", url)
    assert refused.returncode != 0
    assert "no step 'nope'" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_the_api_reruns_and_diffs(tmp_path: Path, ledger: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    recipe = write_proof(tmp_path)

    parent = asyncio.run(executed(url, recipe))
    # A client reruns a recipe of the server's folder (the one the run came from, here).
    config = ServiceConfig(token="t" * 40, database_url=url, recipes=tmp_path)
    with (
        app_in_thread(create_app(config)) as base,
        httpx2.Client(base_url=base, headers=auth("t" * 40), timeout=60) as client,
    ):
        # Which steps a rerun may start from: those that ran, as the server says.
        assert set(client.get(f"/runs/{parent}").json()["rerun_from"]) == set(STEPS)
        # A preview: the rerun's own plan (an output set by hand, an input changed: more runs
        # again than what follows the step), and nothing queued.
        edit = {"from_step": "report", "inputs": {"extra": "y"}, "outputs": {"left": "edited"}}
        total = client.get("/runs").json()["total"]
        preview = client.post(f"/runs/{parent}/rerun/preview", json=edit)
        assert preview.status_code == 200, preview.text
        assert preview.json() == previewed(parent)
        assert client.get("/runs").json()["total"] == total
        # The rerun itself reuses what its preview said.
        made = client.post(f"/runs/{parent}/rerun", json=edit)
        assert made.status_code == 201, made.text
        assert {k: made.json()[k] for k in ("reused", "rerun", "changed")} == {
            k: preview.json()[k] for k in ("reused", "rerun", "changed")
        }
        asyncio.run(executed(url, run_id=made.json()["run_id"]))
        statuses = {s["step_id"]: s["status"] for s in client.get(f"/runs/{made.json()['run_id']}").json()["steps"]}  # fmt: skip
        assert sorted(s for s, status in statuses.items() if status == "reused") == sorted(
            preview.json()["reused"]
        )
        # Refused as the rerun is: an unknown step, an output that cannot be set, bad inputs,
        # an unknown run, a run that has not ended.
        for bad, kind in (
            ({"from_step": "nope"}, "invalid_rerun"),
            ({"from_step": "left", "outputs": {"each": 1}}, "invalid_rerun"),
            ({"from_step": "left", "inputs": {"tag": 5}}, None),
        ):
            refused = client.post(f"/runs/{parent}/rerun/preview", json=bad)
            assert refused.status_code == 400, (bad, refused.text)
            assert kind is None or refused.json()["error"]["type"] == kind
        assert (
            client.post("/runs/nope/rerun/preview", json={"from_step": "ship"}).status_code == 404
        )
        queued = client.post("/runs", json={"recipe": "proof", "inputs": {"tag": "q"}}).json()
        early = client.post(f"/runs/{queued['run_id']}/rerun/preview", json={"from_step": "ship"})
        assert (early.status_code, early.json()["error"]["type"]) == (409, "wrong_state")
        assert client.get(f"/runs/{queued['run_id']}").json()["rerun_from"] == []
        assert client.post(f"/runs/{queued['run_id']}/cancel").status_code == 200

        response = client.post(
            f"/runs/{parent}/rerun",
            json={"from_step": "ship", "inputs": {}, "outputs": {"right": "by hand"}},
        )
        assert response.status_code == 201, response.text
        body = response.json()
        assert {k: body[k] for k in ("status", "parent_run_id", "from_step")} == {
            "status": "queued",
            "parent_run_id": parent,
            "from_step": "ship",
        }
        run_id = body["run_id"]

        asyncio.run(executed(url, run_id=run_id))
        shown = client.get(f"/runs/{run_id}").json()
        assert (shown["parent_run_id"], shown["from_step"]) == (parent, "ship")
        assert {s["step_id"]: s["status"] for s in shown["steps"]}["right"] == "reused"
        diff = client.get(f"/runs/{parent}/diff/{run_id}").json()
        assert diff["first_divergence"] == "right"
        wrong = client.post(f"/runs/{parent}/rerun", json={"from_step": "nope"})
        assert (wrong.status_code, wrong.json()["error"]["type"]) == (400, "invalid_rerun")
        unknown = client.post("/runs/nope/rerun", json={"from_step": "ship"})
        assert unknown.status_code == 404
        assert client.get(f"/runs/{parent}/diff/nope").status_code == 404


def test_a_schema_2_store_migrates(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    from minions.runs._db import Database
    from minions.runs._tables import SCHEMA_VERSION

    Database(url, create=True).close()
    with sqlite3.connect(path) as db:  # what schema 2 had
        for column in ("parent_run_id", "from_step", "rerun"):
            db.execute(f"ALTER TABLE minions_runs DROP COLUMN {column}")
        db.execute("DROP TABLE minions_step_cache")
        db.execute("UPDATE minions_meta SET value = '2' WHERE key = 'schema_version'")
    Database(url).close()
    with sqlite3.connect(path) as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(minions_runs)")}
        version = db.execute("SELECT value FROM minions_meta").fetchone()[0]
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    assert {"parent_run_id", "from_step", "rerun"} <= columns
    assert "minions_step_cache" in tables
    assert "minions_audit" in tables
    assert version == str(SCHEMA_VERSION)


# -- the rule, as a property -------------------------------------------------------------------


@st.composite
def graphs(draw: st.DrawFn) -> tuple[int, set[tuple[int, int]], set[int], int]:
    """A random DAG (edges from a lower to a higher step), the steps that read input `x`,
    and the step to rerun from."""
    size = draw(st.integers(1, 9))
    pairs = [(a, b) for a in range(size) for b in range(a + 1, size)]
    edges = set(draw(st.lists(st.sampled_from(pairs), unique=True))) if pairs else set()
    readers = set(draw(st.lists(st.integers(0, size - 1), unique=True)))
    return size, edges, readers, draw(st.integers(0, size - 1))


def descendants(edges: set[tuple[int, int]], start: set[int]) -> set[int]:
    """Every step reachable from `start` (itself included), by repeated relaxation."""
    found = set(start)
    while True:
        more = {b for a, b in edges if a in found} - found
        if not more:
            return found
        found |= more


@given(graphs())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_what_runs_again_is_the_chosen_step_its_descendants_and_changed_steps(
    case: tuple[int, set[tuple[int, int]], set[int], int],
) -> None:
    size, edges, readers, start = case
    lines = ["id: g", "inputs: {x: {type: string}, y: {type: string}}", "steps:"]
    for n in range(size):
        deps = sorted(a for a, b in edges if b == n)
        read = "x" if n in readers else "y"
        lines.append(
            f'  - {{id: s{n}, goal: "work on {{{{ inputs.{read} }}}}", '
            f"depends_on: [{', '.join(f's{d}' for d in deps)}]}}"
        )
    from minions._agent.graph import StepGraph

    graph = StepGraph(parse_recipe("\n".join(lines) + "\n"))
    parent = RunRecord(
        run_id="p",
        recipe_id="g",
        status="completed",
        created_at=0.0,
        inputs={"x": "1", "y": "1"},
        steps=tuple(
            StepRecord(step_id=f"s{n}", visit=1, status="completed", output=f"o{n}")
            for n in range(size)
        ),
    )
    plan = plan_rerun(parent, graph, from_step=f"s{start}", inputs={"x": "2", "y": "1"}, outputs={})
    want = descendants(edges, {start} | readers)
    assert set(plan.rerun) == {f"s{n}" for n in want}
    assert set(plan.reused) == {f"s{n}" for n in range(size)} - set(plan.rerun)
    assert set(plan.changed) == {f"s{n}" for n in readers}
    # The same inputs change nothing but the chosen step and what follows it.
    same = plan_rerun(parent, graph, from_step=f"s{start}", inputs=parent.inputs, outputs={})
    assert set(same.rerun) == {f"s{n}" for n in descendants(edges, {start})}
    assert set(same.rerun) == reexecuted(graph.followers, from_step=f"s{start}")


def test_a_rerun_is_offered_from_the_steps_that_ran_once_the_run_ended() -> None:
    from minions.runs import ApprovalRecord

    ran = RunRecord(
        run_id="r",
        recipe_id="g",
        status="cancelled",
        created_at=0.0,
        steps=(
            StepRecord(step_id="a", visit=1, status="completed"),
            StepRecord(step_id="b", visit=1, status="skipped"),
            StepRecord(step_id="c", visit=1, status="failed"),
            StepRecord(step_id="a", visit=2, status="reused"),
        ),
        # Cancelled while a call of a loop item waited for a decision: its step ran.
        approvals=(
            ApprovalRecord(call_id="x", step_id="d[0]", tool="t", arguments={}, requested_at=0.0),
        ),
    )
    assert ran.rerun_from == ("a", "c", "d")
    assert ran.completed_steps == {"a"}
    import dataclasses

    assert dataclasses.replace(ran, status="waiting").rerun_from == ()
