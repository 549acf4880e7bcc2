"""OpenTelemetry spans of a durable run whose execution ends before the run does: a park (a
call waits for a person) or a hand-back (its worker drains) cancels its work without failing
it, so those spans end without an error and say why (``minions.cut_short``); the execution
that goes on later says so on its spans. A real failure is still an error. Runs run in this
process, on SQLite (the spans do not depend on the store)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from runs_helpers import run_here

from minions import Message, ModelCallResponse, ModelError, Prompt, RunSettings, ToolCall, Usage
from minions._tracing.tracer import RunTracer
from minions.runs import RunStore, _runner
from minions.testing import FunctionModel

TOOLS = '''\
from minions import tool


@tool(requires_approval=True)
def deploy(target: str) -> str:
    """Deploy to a target."""
    return f"deployed {target}"
'''

RELEASE = """\
id: release
tools: [release_tools]
steps:
  - id: check
    goal: Check the release notes.
    optional: true
  - id: look
    goal: Look around.
  - id: ship
    goal: Deploy to prod.
    tools: [deploy]
    depends_on: [check]
"""

GATE = """\
id: gate
tools: [release_tools]
steps:
  - id: ship
    tool: deploy
    params: {target: prod}
"""

OUTER = """\
id: outer
steps:
  - id: sub
    recipe: gate.yaml
"""

LOOK = """\
id: looking
steps:
  - id: look
    goal: Look around.
"""


class Release:
    """The model of the release's steps: `check` fails (a real failure); `look` is in flight
    until the run's execution is cut short (when `hang`), else answers; `ship` asks for the
    deploy once `look` is in flight, and says it is done when told the result."""

    def __init__(self, *, hang: bool) -> None:
        self.hang = hang
        self.looking = asyncio.Event()
        self.model = FunctionModel(self.answer)

    async def answer(self, prompt: Prompt) -> ModelCallResponse | str:
        goal = next(m.content for m in prompt.messages if m.role == "user") or ""
        if "release notes" in goal:
            raise ModelError("the model refused to check")
        if "Look around" in goal:
            self.looking.set()
            if self.hang:
                await asyncio.Event().wait()  # cancelled with the run's execution
            return "Nothing to see."
        if prompt.messages[-1].role == "tool":
            return "Deployed."
        await self.looking.wait()
        call = ToolCall(id="deploy-1", name="deploy", arguments={"target": "prod"})
        return ModelCallResponse(
            message=Message.assistant("", [call]),
            usage=Usage.of_call(10, 5),
            finish_reason="tool_calls",
        )


def traced() -> tuple[InMemorySpanExporter, RunTracer]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, RunTracer(provider)


def named(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    [found] = [s for s in spans if s.name == name]
    return found


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def under(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


def cut_short(span: ReadableSpan, why: str) -> None:
    """`span` ended without an error, saying why its work was cut short."""
    assert span.status.status_code is StatusCode.UNSET, (span.name, span.status)
    assert attrs(span).get("minions.cut_short") == why, span.name
    assert "error.type" not in attrs(span), span.name
    assert not span.events, span.name  # no exception recorded


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store' / 'minions.db'}"


async def submitted(folder: Path, url: str, recipes: dict[str, str]) -> tuple[RunStore, str]:
    """A run of the first of `recipes` (file name: YAML), written in `folder` beside the
    others and the release's tools, submitted to a new store at `url`."""
    (folder / "release_tools.py").write_text(TOOLS)
    for name, text in recipes.items():
        (folder / name).write_text(text)
    store = RunStore(url, create=True)
    run_id, _ = await store.submit(folder / next(iter(recipes)))
    return store, run_id


@pytest.mark.parametrize("kept", [True, False], ids=["kept", "over-the-limit"])
async def test_a_parked_execution_ends_its_spans_without_error_and_the_next_one_goes_on(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch, kept: bool
) -> None:
    """The run parks at `ship`'s deploy while `look`'s model call is in flight: the run's,
    both steps' and that call's spans end as parked, not failed; `check`, which failed before
    the park, is still an error. The execution the decision queues is the run's attempt 2,
    resumed, and `ship`'s span says where it goes on (or why it starts again)."""
    if not kept:
        monkeypatch.setattr(_runner, "STATE_LIMIT", 10)
    store, run_id = await submitted(tmp_path, url, {"release.yaml": RELEASE})
    exporter, tracer = traced()

    await run_here(url, run_id, model=Release(hang=True).model, tracer=tracer)
    record = await store.get(run_id)
    assert record.status == "waiting"
    [approval] = record.approvals
    spans = exporter.get_finished_spans()
    run = named(spans, "invoke_workflow release")
    cut_short(run, "parked")
    assert attrs(run)["minions.run.attempt"] == 1
    assert "minions.run.resumed" not in attrs(run)
    for name in ("invoke_agent ship", "invoke_agent look"):
        cut_short(named(spans, name), "parked")
    [in_flight] = under(spans, named(spans, "invoke_agent look"))
    assert in_flight.name.startswith("chat ")
    cut_short(in_flight, "parked")
    # A real failure, before the park: an error still, and only it.
    check = named(spans, "invoke_agent check")
    assert check.status.status_code is StatusCode.ERROR
    assert attrs(check)["error.type"] == "minions.errors.ModelError"
    assert "minions.cut_short" not in attrs(check)
    failed = [s for s in spans if s.status.status_code is StatusCode.ERROR]
    assert sorted(s.name for s in failed) == sorted(
        [check.name, *(s.name for s in under(spans, check))]
    )

    await store.approve(run_id, actor="alice")
    exporter.clear()
    await run_here(url, run_id, 2, model=Release(hang=False).model, tracer=tracer)
    assert (await store.get(run_id)).status == "completed"
    spans = exporter.get_finished_spans()
    run = named(spans, "invoke_workflow release")
    assert attrs(run)["minions.run.attempt"] == 2
    assert attrs(run)["minions.run.resumed"] is True
    assert attrs(run)["minions.run.id"] == run_id
    ship = named(spans, "invoke_agent ship")
    assert ship.status.status_code is StatusCode.UNSET
    assert not [s for s in spans if "minions.cut_short" in attrs(s)]
    if kept:
        assert attrs(ship)["minions.step.resumed_at"] == approval.call_id == "ship#1/deploy-1"
        assert "minions.step.restarted" not in attrs(ship)
    else:
        assert "minions.step.resumed_at" not in attrs(ship)
        assert "over the 10 a parked run keeps" in attrs(ship)["minions.step.restarted"]
    store.close()


async def test_a_recipe_step_s_run_parked_inside_it_ends_as_parked(
    tmp_path: Path, url: str
) -> None:
    """A call of a recipe step's inner run parks the run that holds it: the inner run's
    spans, the recipe step's and the run's end as parked, not failed."""
    store, run_id = await submitted(tmp_path, url, {"outer.yaml": OUTER, "gate.yaml": GATE})
    exporter, tracer = traced()
    await run_here(url, run_id, tracer=tracer)
    assert (await store.get(run_id)).status == "waiting"
    spans = exporter.get_finished_spans()
    assert sorted(s.name for s in spans) == [
        "invoke_agent ship",
        "invoke_agent sub",
        "invoke_workflow gate",
        "invoke_workflow outer",
    ]
    for span in spans:
        cut_short(span, "parked")
    store.close()


async def test_a_handed_back_execution_ends_its_spans_without_error(
    tmp_path: Path, url: str
) -> None:
    """A worker that drains hands its run back with a model call in flight: that call's, its
    step's and the run's spans end as handed back, not failed."""
    from minions.runs._async import AsyncDatabase
    from minions.runs._db import Database

    store, run_id = await submitted(tmp_path, url, {"looking.yaml": LOOK})
    exporter, tracer = traced()
    model = Release(hang=True)
    database = AsyncDatabase(Database(url), patient=True)
    try:
        runner = _runner.RunExecutor(
            database,
            executor_id="here",
            incarnation="here",
            settings=RunSettings(model=model.model, tracer=tracer),
        )
        delivery = asyncio.create_task(runner.execute(run_id, 1))
        await model.looking.wait()
        await runner.drain(0)
        await delivery
    finally:
        database.close()
    # Its lease let go (no queue here): a live worker takes it over from its checkpoints.
    assert (await store.get(run_id)).status == "running"
    spans = exporter.get_finished_spans()
    assert [s.name.split(" ")[0] for s in spans] == ["chat", "invoke_agent", "invoke_workflow"]
    for span in spans:
        cut_short(span, "handed_back")
    store.close()
