"""Record a run's model replies and replay them offline, keyed so timing does not matter."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from agent_helpers import GatedModel
from conftest import FAST, add
from pydantic import BaseModel

from minions import (
    AgentContext,
    AgentExecutor,
    AgentRecipe,
    DefaultStep,
    MinionsError,
    OutputInstructions,
    RecordingError,
    StepExecution,
    StepExecutor,
    StepStatus,
    TransientModelError,
)
from minions.models._base import Model
from minions.models._recording import Recording, RecordingModel, ReplayMissError, ReplayModel
from minions.recipes._subrecipe import RecipeStep
from minions.testing import FunctionModel, ScriptedModel


class Total(BaseModel):
    total: int


def steps() -> list[DefaultStep]:
    return [
        DefaultStep("sum", "Add 1 and 2.", tools={"add"}, output=OutputInstructions(Total)),
        DefaultStep("greet", "Say hi."),
    ]


async def run_all(context: AgentContext) -> list[StepExecution]:
    # The two steps run at the same time: their calls interleave.
    return list(await asyncio.gather(*(StepExecutor(s, context).execute() for s in steps())))


def test_record_then_replay_gives_the_same_result(tmp_path: Path) -> None:
    # Each answer takes an event-loop turn, so the two steps' calls interleave.
    real = GatedModel(
        [
            [("add", {"a": 1, "b": 2})],
            "hi!",
            TransientModelError("503", status_code=503),
            '{"total": 3}',
        ],
        name="scripted",
        turns=1,
    )
    recording = Recording()
    recorded = asyncio.run(
        run_all(AgentContext(model=RecordingModel(real, recording), tools=[add], config=FAST))
    )
    path = tmp_path / "run.recording.json"
    recording.save(path)
    assert json.loads(path.read_text())["format"] == "minions.recording/1"

    replay = ReplayModel(path)
    replayed = asyncio.run(run_all(AgentContext(model=replay, tools=[add], config=FAST)))
    for before, after in zip(recorded, replayed, strict=True):
        assert after.status is StepStatus.COMPLETED
        assert after.output == before.output
        assert after.usage == before.usage
        assert after.messages == before.messages
        assert [(c.turn, c.attempt, c.error) for c in after.model_calls] == [
            (c.turn, c.attempt, c.error) for c in before.model_calls
        ]
    assert replay.changed_prompts == []


def test_replay_keys_do_not_depend_on_timing() -> None:
    """Whichever step asks first, each gets its own recorded replies."""
    recording = Recording()
    real = ScriptedModel([[("add", {"a": 1, "b": 2})], "hi!", '{"total": 3}'])
    asyncio.run(
        run_all(AgentContext(model=RecordingModel(real, recording), tools=[add], config=FAST))
    )
    assert sorted(recording.entries) == ["greet#1/1", "sum#1/1", "sum#1/2"]

    async def reversed_order(context: AgentContext) -> list[StepExecution]:
        first = await StepExecutor(steps()[1], context).execute()
        second = await StepExecutor(steps()[0], context).execute()
        return [second, first]

    replayed = asyncio.run(reversed_order(AgentContext(model=ReplayModel(recording), tools=[add])))
    assert [e.output for e in replayed] == [Total(total=3), "hi!"]


def test_a_missing_reply_fails_naming_the_step_and_call() -> None:
    recording = Recording()
    asyncio.run(
        StepExecutor(
            DefaultStep("greet", "Say hi."),
            AgentContext(model=RecordingModel(ScriptedModel(["hi"]), recording)),
        ).execute()
    )
    step = DefaultStep("greet", "Say hi.", completion_marker="DONE")
    execution = asyncio.run(
        StepExecutor(step, AgentContext(model=ReplayModel(recording))).execute()
    )
    assert execution.status is StepStatus.FAILED
    assert execution.error == (
        "the recording has no reply for model call 2 of step 'greet' (scope 'greet#1'); "
        "record the run again"
    )
    assert issubclass(ReplayMissError, MinionsError)


def test_changed_prompts_are_reported() -> None:
    recording = Recording()
    context = AgentContext(model=RecordingModel(ScriptedModel(["hi"]), recording))
    asyncio.run(StepExecutor(DefaultStep("greet", "Say hi."), context).execute())
    replay = ReplayModel(recording)
    asyncio.run(
        StepExecutor(DefaultStep("greet", "Say hello."), AgentContext(model=replay)).execute()
    )
    assert replay.changed_prompts == ["greet#1/1"]


def test_the_context_wraps_every_model_once() -> None:
    recording = Recording()
    own = ScriptedModel(["from own model"])
    context = AgentContext(
        model=ScriptedModel(["from default"]),
        model_wrapper=lambda model: RecordingModel(model, recording),
    )
    asyncio.run(StepExecutor(DefaultStep("a", "x"), context).execute())
    asyncio.run(StepExecutor(DefaultStep("b", "y", model=own), context).execute())
    assert context.resolve_model(own) is context.resolve_model(own)
    assert [e["response"]["content"] for e in recording.entries.values()] == [
        "from default",
        "from own model",
    ]


def named_models() -> AgentRecipe:
    """A recipe naming a model of its own, with a step and a sub-recipe naming others."""
    inner = AgentRecipe(
        id="inner", model="openai:gpt-4.1", steps=[DefaultStep("deep", "Think deeply.")]
    )
    return AgentRecipe(
        id="named",
        model="openai:gpt-4o-mini",
        steps=[
            DefaultStep("hello", "Say hello."),
            DefaultStep("bye", "Say bye.", model="openai:gpt-4o", depends_on=["hello"]),
            RecipeStep("sub", inner, depends_on=["bye"]),
        ],
    )


def test_a_model_resolver_replays_every_model_a_recipe_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Replaying needs no key: the resolver, not `infer_model`, turns each model string into a
    model, for the recipe, its steps and its sub-recipes alike."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    asked: list[Model | str | None] = []

    def stand_in(spec: Model | str | None) -> Model:
        asked.append(spec)
        return FunctionModel(lambda prompt: f"{prompt.step_id} via {spec}")

    recording = Recording()
    recorded = AgentExecutor(
        model_resolver=stand_in, model_wrapper=lambda model: RecordingModel(model, recording)
    ).execute_sync(named_models())
    assert recorded.ok, recorded.error
    assert sorted(map(str, asked)) == ["openai:gpt-4.1", "openai:gpt-4o", "openai:gpt-4o-mini"]

    # A default model alone does not cover the models the recipe names.
    default_only = AgentExecutor(model=ReplayModel(recording)).execute_sync(named_models())
    assert default_only.error is not None
    assert "API key" in default_only.error

    replay = ReplayModel(recording)
    replayed = AgentExecutor(model_resolver=lambda _spec: replay).execute_sync(named_models())
    assert replayed.ok, replayed.error
    assert replayed.output == recorded.output == "deep via openai:gpt-4.1"
    assert [e.output for e in replayed.executions] == [e.output for e in recorded.executions]
    assert replay.changed_prompts == []


def test_each_model_is_resolved_once_per_run() -> None:
    own = ScriptedModel(["a", "b"])
    resolved: list[Model | str | None] = []

    def resolver(spec: Model | str | None) -> Model:
        resolved.append(spec)
        return own if isinstance(spec, Model) else ScriptedModel(["x", "y"])

    context = AgentContext(model="some:model", model_resolver=resolver)
    assert context.resolve_model("other:model") is context.resolve_model("other:model")
    assert context.resolve_model(own) is own
    assert context.resolve_model(None) is context.model is context.resolve_model("some:model")
    assert resolved == ["other:model", own, "some:model"]


def test_bad_recording_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(RecordingError, match="does not exist"):
        Recording.load(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(RecordingError, match="is not a minions recording"):
        Recording.load(tmp_path / "bad.json")
    (tmp_path / "text.json").write_text("not json")
    with pytest.raises(RecordingError, match="is not valid JSON"):
        Recording.load(tmp_path / "text.json")
