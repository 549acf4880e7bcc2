"""`block_real_models()`: no real model request inside it, test doubles as usual, nothing left
after it; and the pytest fixture and ini option of the same purpose."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import pytest

from minions import (
    AgentContext,
    AgentExecutor,
    AgentRecipe,
    DefaultStep,
    Message,
    ModelCallResponse,
    Prompt,
    StepExecutor,
    StepStatus,
    tool,
)
from minions.errors import ModelError
from minions.models import Model, OpenAIChatModel, Recording, RecordingModel, ReplayModel
from minions.models._base import TokenCallback
from minions.testing import (
    FakeOpenAIServer,
    FunctionModel,
    ScriptedModel,
    TestModel,
    block_real_models,
)

pytest_plugins = ["pytester"]


class Listener:
    """A TCP port that counts the connections made to it (and answers none)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.05)
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def real() -> Iterator[Listener]:
    listener = Listener()
    yield listener
    listener.close()


class Remote(Model):
    """A provider of a user's own: it says where it is served, and answers without a network
    (so a request that is not refused succeeds)."""

    name = "acme:large"

    @property
    def endpoint(self) -> tuple[str, str]:
        return ("https://api.acme.example/v1", "large")

    async def call(
        self, prompt: Prompt, *, on_token: TokenCallback | None = None
    ) -> ModelCallResponse:
        return ModelCallResponse(message=Message.assistant("from acme"))


def test_a_real_model_inside_the_block_fails_its_step_naming_model_and_endpoint(
    real: Listener,
) -> None:
    model = OpenAIChatModel("gpt-4o-mini", base_url=real.url, api_key="sk-secret-123456")
    with block_real_models() as block:
        execution = StepExecutor(DefaultStep("s", "Hi."), AgentContext(model=model)).execute_sync()
        with pytest.raises(ModelError, match="a real model request was blocked"):
            asyncio.run(model.check())  # the pre-flight check too
        with pytest.raises(ModelError, match="a real model request was blocked"):
            asyncio.run(model.call(Prompt(messages=(Message.user("Hi."),))))
    assert execution.status is StepStatus.FAILED
    assert execution.error == (
        f"a real model request was blocked: openai:gpt-4o-mini at {real.url}. Inside "
        "block_real_models(), give the step or executor a test double (TestModel, ScriptedModel, "
        "FunctionModel, ReplayModel or a FakeOpenAIServer's model), or allow the endpoint with "
        "block_real_models(allow=[...])"
    )
    assert block.blocked == [f"openai:gpt-4o-mini at {real.url}"] * 3
    assert real.connections == 0
    # Recording a real model is a real request too.
    with block_real_models():
        recorded = RecordingModel(model, Recording())
        failed = StepExecutor(DefaultStep("s", "Hi."), AgentContext(model=recorded)).execute_sync()
    assert "a real model request was blocked" in (failed.error or "")
    assert real.connections == 0


def test_a_run_without_a_model_names_minions_model(
    real: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MINIONS_MODEL", f"openai-compatible:llama@{real.url}")
    with block_real_models():
        result = AgentExecutor().execute_sync(AgentRecipe(id="r", steps=[DefaultStep("s", "Hi.")]))
    assert result.status is StepStatus.FAILED
    error = result.step("s").error or ""
    assert error.startswith(
        f"a real model request was blocked: openai-compatible:llama at {real.url} "
        f"(MINIONS_MODEL is 'openai-compatible:llama@{real.url}': a step or run given no model "
        "uses it)."
    )
    assert real.connections == 0


def test_test_doubles_replays_and_fake_servers_still_answer() -> None:
    recording = Recording()
    with FakeOpenAIServer(["Hello from the fake."]) as server:
        stale = server.model()
        with block_real_models() as block:
            served = StepExecutor(
                DefaultStep("s", "Hi."),
                AgentContext(model=RecordingModel(server.model(), recording)),
            ).execute_sync()
            replayed = StepExecutor(
                DefaultStep("s", "Hi."), AgentContext(model=ReplayModel(recording))
            ).execute_sync()
            doubles = [
                StepExecutor(DefaultStep("s", "Hi."), AgentContext(model=m)).execute_sync().output
                for m in (TestModel(), ScriptedModel(["scripted"]), FunctionModel(lambda p: "fn"))
            ]
    assert served.output == replayed.output == "Hello from the fake."
    assert doubles == ["success (no tool calls)", "scripted", "fn"]
    assert block.blocked == []
    # A stopped fake server is no longer allowed: its port may be anything by now.
    with block_real_models(), pytest.raises(ModelError, match="blocked"):
        asyncio.run(stale.call(Prompt(messages=(Message.user("Hi."),))))


def test_any_provider_that_names_its_server_is_refused_and_allow_lets_it_through() -> None:
    step = DefaultStep("s", "Hi.")
    with block_real_models():
        refused = StepExecutor(step, AgentContext(model=Remote())).execute_sync()
        with block_real_models(allow=["https://api.acme.example"]) as inner:
            allowed = StepExecutor(step, AgentContext(model=Remote())).execute_sync()
    assert "blocked: acme:large at https://api.acme.example/v1" in (refused.error or "")
    assert allowed.output == "from acme"
    assert inner.blocked == []
    # Nothing is left blocked after the block.
    assert StepExecutor(step, AgentContext(model=Remote())).execute_sync().output == "from acme"


async def test_concurrent_tasks_nest_and_only_the_blocked_one_is_refused() -> None:
    inside_started = asyncio.Event()
    outside_done = asyncio.Event()
    step = DefaultStep("s", "Hi.")

    async def inside() -> tuple[str | None, list[str]]:
        with block_real_models() as outer:
            inside_started.set()
            await outside_done.wait()  # the other task runs while this one is blocked
            with block_real_models() as inner:
                execution = await StepExecutor(step, AgentContext(model=Remote())).execute()
            assert inner.blocked == ["acme:large at https://api.acme.example/v1"]
        return execution.error, outer.blocked

    async def outside() -> str | None:
        await inside_started.wait()
        execution = await StepExecutor(step, AgentContext(model=Remote())).execute()
        outside_done.set()
        return execution.output

    (error, blocked), output = await asyncio.gather(inside(), outside())
    assert output == "from acme"
    assert "blocked" in (error or "")
    assert blocked == ["acme:large at https://api.acme.example/v1"]  # the outer block saw it


def test_a_sync_tool_s_thread_is_inside_the_block() -> None:
    @tool
    def ask_another_model(question: str) -> str:
        """Runs a step of its own, synchronously, in the tool's thread."""
        inner = StepExecutor(DefaultStep("inner", question), AgentContext(model=Remote()))
        return inner.execute_sync().error or "answered"

    model = ScriptedModel([[("ask_another_model", {"question": "Hi?"})], "done"])
    with block_real_models():
        execution = StepExecutor(
            DefaultStep("s", "Go.", tools={"ask_another_model"}),
            AgentContext(model=model, tools=[ask_another_model]),
        ).execute_sync()
    [call] = execution.tool_calls
    assert call.response is not None
    assert "a real model request was blocked: acme:large" in call.response.content


PLUGIN_TEST = """
from minions import AgentContext, DefaultStep, StepExecutor
from minions.testing import TestModel
from tests_remote import Remote


def test_forgot_the_model(block_real_models):
    StepExecutor(DefaultStep("s", "Hi."), AgentContext(model=Remote())).execute_sync()


def test_meant_to_be_refused(block_real_models):
    StepExecutor(DefaultStep("s", "Hi."), AgentContext(model=Remote())).execute_sync()
    assert block_real_models.blocked
    block_real_models.blocked.clear()


def test_with_a_double(block_real_models):
    out = StepExecutor(DefaultStep("s", "Hi."), AgentContext(model=TestModel())).execute_sync()
    assert out.output == "success (no tool calls)"


async def test_async_tests_are_inside_the_block_too(block_real_models):
    await StepExecutor(DefaultStep("s", "Hi."), AgentContext(model=Remote())).execute()
    assert block_real_models.blocked == ["acme:large at https://api.acme.example/v1"]
    block_real_models.blocked.clear()


def test_without_the_fixture():
    out = StepExecutor(DefaultStep("s", "Hi."), AgentContext(model=Remote())).execute_sync()
    assert out.output == "from acme", out.error
"""

REMOTE = """
from minions import Message, ModelCallResponse
from minions.models import Model


class Remote(Model):
    name = "acme:large"

    @property
    def endpoint(self):
        return ("https://api.acme.example/v1", "large")

    async def call(self, prompt, *, on_token=None):
        return ModelCallResponse(message=Message.assistant("from acme"))
"""


def test_the_pytest_fixture_and_the_ini_option(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(tests_remote=REMOTE, test_agent=PLUGIN_TEST)
    ini = "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    pytester.makeini(ini)
    result = pytester.runpytest_inprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=5, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*test_agent.py::test_forgot_the_model: 1 real model request blocked: acme:large at "
            "https://api.acme.example/v1. Give the code a test double*"
        ]
    )
    # With the ini option every test is blocked, as if it asked for the fixture.
    pytester.makeini(ini + "minions_block_real_models = true\n")
    result = pytester.runpytest_inprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, failed=1, errors=2)
    result.stdout.fnmatch_lines(["*test_without_the_fixture*", "*blocked: acme:large*"])
