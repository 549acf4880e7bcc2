"""`FallbackModel`: the next model once one's retries are spent on transient errors, over real
HTTP to two `FakeOpenAIServer`s; what is recorded of each attempt; what does not fall through;
recipes' `model:` lists."""

from __future__ import annotations

import dataclasses
import socket
from typing import Any

import pytest
from pydantic import BaseModel

from minions import (
    AgentContext,
    AgentExecutor,
    AgentRecipe,
    DefaultStep,
    Message,
    OutputInstructions,
    Prompt,
    StepExecutor,
    StepStatus,
    tool,
)
from minions.errors import ModelError, RecipeError, TransientModelError
from minions.events import Event, ModelCallStarted, RetryScheduled
from minions.models import (
    FallbackModel,
    Model,
    OpenAIChatModel,
    Recording,
    RecordingModel,
    ReplayModel,
)
from minions.recipes import dump_recipe, parse_recipe
from minions.testing import FakeOpenAIServer, FakeReply, ScriptedModel

from .conftest import FAST

RETRIES = dataclasses.replace(FAST, max_model_retries=2)
"""Three attempts per model."""


def dead_url() -> str:
    """A base URL on 127.0.0.1 where nothing listens (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def run(model: Model, step: DefaultStep | None = None, **context: Any) -> Any:
    events: list[Event] = []
    context.setdefault("config", RETRIES)
    ctx = AgentContext(model=model, listeners=[events.append], **context)
    execution = StepExecutor(step or DefaultStep("s", "Hi."), ctx).execute_sync()
    return execution, events


@pytest.mark.parametrize(
    "fault",
    [FakeReply.server_error(503), FakeReply.server_error(500), FakeReply.rate_limit(0.01)],
    ids=["503", "500", "429"],
)
def test_the_next_model_answers_once_the_first_one_s_retries_are_spent(fault: FakeReply) -> None:
    with (
        FakeOpenAIServer([fault] * 3) as first,
        FakeOpenAIServer(["Hello from the second."]) as second,
    ):
        model = FallbackModel(first.model("big"), second.model("small"))
        execution, events = run(model)
        assert len(first.chat_requests) == 3  # its own retries, no more
        assert len(second.chat_requests) == 1
        urls = first.url, second.url
    assert execution.status is StepStatus.COMPLETED
    assert execution.output == "Hello from the second."
    # Each attempt says which model and endpoint it asked, and numbers go on across models.
    assert [(c.attempt, c.model, c.endpoint, c.ok) for c in execution.model_calls] == [
        (1, "fake:big", urls[0], False),
        (2, "fake:big", urls[0], False),
        (3, "fake:big", urls[0], False),
        (4, "fake:small", urls[1], True),
    ]
    started = [(e.attempt, e.model, e.endpoint) for e in events if isinstance(e, ModelCallStarted)]
    assert started == [(c.attempt, c.model, c.endpoint) for c in execution.model_calls]
    fallback = [e for e in events if isinstance(e, RetryScheduled)][-1]
    assert fallback.reason.startswith("fake:big gave up (fake:big at ")
    assert fallback.reason.endswith("; trying fake:small")


def test_a_dead_endpoint_falls_through_to_a_live_one() -> None:
    dead = OpenAIChatModel("llama", base_url=dead_url(), provider="local", timeout=5)
    with FakeOpenAIServer(["Alive."]) as live:
        execution, _ = run(FallbackModel(dead, live.model()))
    assert execution.output == "Alive."
    assert [c.model for c in execution.model_calls] == ["local:llama"] * 3 + ["fake:fake-model"]
    assert "connection failed" in (execution.model_calls[0].error or "")


@pytest.mark.parametrize(
    "fault",
    [
        FakeReply.failure(400, "Invalid value for 'temperature'."),
        FakeReply.failure(401, "Incorrect API key provided."),
    ],
    ids=["400", "401"],
)
def test_errors_that_are_not_the_endpoint_being_down_do_not_fall_through(fault: FakeReply) -> None:
    with FakeOpenAIServer([fault]) as first, FakeOpenAIServer(["never"]) as second:
        execution, _ = run(FallbackModel(first.model(), second.model()))
        assert len(first.chat_requests) == 1
        assert second.chat_requests == []
    assert execution.status is StepStatus.FAILED
    assert f"HTTP {fault.status}" in (execution.error or "")


class City(BaseModel):
    name: str
    country: str


def test_an_answer_that_fails_its_schema_is_re_asked_of_the_same_model() -> None:
    output = OutputInstructions(City)
    with (
        FakeOpenAIServer(['{"name": "Oslo"}', '{"name": "Oslo", "country": "Norway"}']) as first,
        FakeOpenAIServer(["never"]) as second,
    ):
        step = DefaultStep("s", "Where?", output=output)
        execution, _ = run(FallbackModel(first.model(), second.model()), step)
        assert second.chat_requests == []
    assert execution.output == City(name="Oslo", country="Norway")


def test_every_model_failing_names_each_one() -> None:
    with (
        FakeOpenAIServer([FakeReply.server_error(502)] * 3) as first,
        FakeOpenAIServer([FakeReply.server_error(503)] * 3) as second,
    ):
        execution, _ = run(FallbackModel(first.model("a"), second.model("b")))
    assert execution.status is StepStatus.FAILED
    error = execution.error or ""
    assert error.startswith(
        "every model of the fallback failed: fake:a after 3 attempts: fake:a at "
    )
    assert "HTTP 502" in error
    assert "; fake:b after 3 attempts: fake:b at " in error
    assert "HTTP 503" in error


@tool
def lookup(city: str) -> str:
    """Look a city up."""
    return "Norway"


def test_the_step_goes_on_with_the_model_that_answered_and_the_next_step_starts_over() -> None:
    with (
        FakeOpenAIServer([FakeReply.server_error(503)] * 3 + ["First again."]) as first,
        FakeOpenAIServer([[("lookup", {"city": "Oslo"})], "Oslo is in Norway."]) as second,
    ):
        model = FallbackModel(first.model("a"), second.model("b"))
        recipe = AgentRecipe(
            id="r",
            steps=[
                DefaultStep("geo", "Where is Oslo?", tools={"lookup"}),
                DefaultStep("next", "And then?", depends_on=["geo"]),
            ],
        )
        executor = AgentExecutor(model=model, tools=[lookup], config=RETRIES)
        result = executor.execute_sync(recipe)
        assert len(first.chat_requests) == 4
        assert len(second.chat_requests) == 2
    geo = result.step("geo")
    assert geo.output == "Oslo is in Norway."
    assert [c.model for c in geo.model_calls] == ["fake:a"] * 3 + ["fake:b"] * 2
    assert [c.model for c in result.step("next").model_calls] == ["fake:a"]


def test_what_each_endpoint_taught_the_structured_output_ladder_stays_its_own() -> None:
    city = City(name="Oslo", country="Norway")
    with (
        FakeOpenAIServer([FakeReply.server_error(503)] * 3, reject={"response_format"}) as first,
        FakeOpenAIServer([city]) as second,
    ):
        a, b = first.model("a"), second.model("b")
        step = DefaultStep("s", "Where?", output=OutputInstructions(City))
        execution, _ = run(FallbackModel(a, b), step)
    assert execution.output == city
    # The first refused native JSON (a 400 naming response_format, learned, not a fallback),
    # then was down; the second did native JSON.
    assert "json_schema" in a.rejected
    assert a.output_mode is None
    assert b.rejected == frozenset()
    assert b.output_mode == "json_schema"
    assert execution.model_calls[-1].output_mode == "json_schema"


def test_a_recording_of_a_fallback_replays_without_any_server() -> None:
    recording = Recording()
    with (
        FakeOpenAIServer([FakeReply.server_error(503)] * 3) as first,
        FakeOpenAIServer(["Recorded."]) as second,
    ):
        recipe = AgentRecipe(
            id="r",
            steps=[DefaultStep("s", "Hi.")],
            model=FallbackModel(first.model("a"), second.model("b")),
        )
        recorded = AgentExecutor(
            config=RETRIES, model_wrapper=lambda m: RecordingModel(m, recording)
        ).execute_sync(recipe)
    assert recorded.output == "Recorded."
    assert sorted(recording.entries) == ["s#1/1", "s#1/2", "s#1/3", "s#1/4"]
    replay = ReplayModel(recording)
    replayed = AgentExecutor(config=RETRIES, model_resolver=lambda _spec: replay).execute_sync(
        recipe
    )
    assert replayed.output == "Recorded."
    assert [c.ok for c in replayed.step("s").model_calls] == [False, False, False, True]


async def test_called_on_its_own_each_model_is_asked_once() -> None:
    prompt = Prompt(messages=(Message.user("Hi."),))
    down = ScriptedModel([TransientModelError("HTTP 503", status_code=503)])
    refusing = ScriptedModel([ModelError("HTTP 400", status_code=400)])
    up = ScriptedModel(["up"])
    assert (await FallbackModel(down, up).call(prompt)).text == "up"
    with pytest.raises(ModelError, match="HTTP 400"):
        await FallbackModel(refusing, ScriptedModel(["never"])).call(prompt)
    assert FallbackModel(FallbackModel(down, refusing), up).models == (down, refusing, up)


def test_bad_fallbacks_are_refused_naming_what_is_wrong() -> None:
    with pytest.raises(ModelError, match=r"FallbackModel needs at least one model"):
        FallbackModel()
    with pytest.raises(
        ModelError, match=r"FallbackModel's model 2 must be a Model or a model string"
    ):
        FallbackModel("ollama:llama3.2", 42)  # type: ignore[arg-type]
    with pytest.raises(ModelError, match=r"model 2 must be a Model or a model string"):
        FallbackModel("ollama:llama3.2", " ")


# -- recipes: `model:` lists ----------------------------------------------------------------------


def test_a_recipe_s_model_list_is_a_fallback_over_real_http() -> None:
    with (
        FakeOpenAIServer([FakeReply.server_error(503)] * 3) as first,
        FakeOpenAIServer(["From the list."]) as second,
    ):
        text = f"""\
id: listed
model:
  - openai-compatible:big@{first.url}
  - openai-compatible:small@{second.url}
steps:
  - id: s
    goal: Hi.
  - id: own
    goal: Hi again.
    depends_on: [s]
    model: [openai-compatible:small@{second.url}]
"""
        recipe = parse_recipe(text)
        assert isinstance(recipe.model, FallbackModel)
        assert recipe.model.models == (
            f"openai-compatible:big@{first.url}",
            f"openai-compatible:small@{second.url}",
        )
        second.add("Step's own list.")
        result = AgentExecutor(config=RETRIES).execute_sync(recipe)
        urls = first.url, second.url
    assert result.step("s").output == "From the list."
    assert [c.endpoint for c in result.step("s").model_calls] == [urls[0]] * 3 + [urls[1]]
    assert result.step("own").output == "Step's own list."
    # And back to YAML as it was written.
    assert f"- openai-compatible:big@{urls[0]}" in dump_recipe(recipe)


@pytest.mark.parametrize(
    ("models", "problem"),
    [
        ("[]", "recipe:2: field 'model': List should have at least 1 item after validation, not 0"),
        (
            "\n  - ollama:llama3.2\n  - 42",
            "recipe:4: field 'model.1': Input should be a valid string",
        ),
        (
            "\n  - ollama:llama3.2\n  - olama:llama3.2",
            "recipe:4: field 'model.1': unknown provider 'olama' in model 'olama:llama3.2' (did you "
            "mean 'ollama'?)",
        ),
        (
            "\n  - ollama:llama3.2\n  - ''",
            "recipe:4: field 'model.1': a model string is empty; write one like 'ollama:llama3.2:3b'",
        ),
        (
            "[ollama:a, openai:b, ollama:a]",
            "recipe:2: field 'model': model 'ollama:a' is listed twice; a fallback tries each model "
            "once, in order",
        ),
    ],
)
def test_a_bad_model_list_is_named_by_its_line(models: str, problem: str) -> None:
    with pytest.raises(RecipeError) as raised:
        parse_recipe(f"id: r\nmodel: {models}\nsteps:\n  - id: s\n    goal: Hi.\n")
    assert [str(p) for p in raised.value.problems] == [problem]
