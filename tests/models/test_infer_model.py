"""Model strings: `infer_model`, `AgentContext(model="...")` and the `MINIONS_MODEL`,
`OPENAI_BASE_URL`, `OPENAI_API_KEY` and `OLLAMA_HOST` environment variables."""

from __future__ import annotations

import subprocess
import sys

import pytest

from minions import AgentContext, DefaultStep, ModelError, StepExecutor, StepStatus
from minions.models import OpenAIChatModel, infer_model
from minions.testing import FakeOpenAIServer, ScriptedModel

from .conftest import FAST


def openai_model(spec: str, **options: object) -> OpenAIChatModel:
    model = infer_model(spec, **options)
    assert isinstance(model, OpenAIChatModel)
    return model


def test_openai_string(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-000000")
    model = openai_model("openai:gpt-4o-mini")
    assert (model.model, model.base_url, model.name) == (
        "gpt-4o-mini",
        "https://api.openai.com/v1",
        "openai:gpt-4o-mini",
    )
    monkeypatch.setenv("OPENAI_BASE_URL", "https://proxy.example/v1")
    assert openai_model("openai:gpt-4o-mini").base_url == "https://proxy.example/v1"


def test_openai_string_without_a_key_says_how_to_give_one() -> None:
    with pytest.raises(ModelError, match="needs an API key: set OPENAI_API_KEY"):
        infer_model("openai:gpt-4o-mini")


def test_ollama_string_keeps_the_tag_and_defaults_to_localhost() -> None:
    model = openai_model("ollama:llama3.2:3b")
    assert (model.model, model.base_url, model.name) == (
        "llama3.2:3b",
        "http://localhost:11434/v1",
        "ollama:llama3.2:3b",
    )


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("gpu-box", "http://gpu-box:11434/v1"),
        ("10.0.0.5:11500", "http://10.0.0.5:11500/v1"),
        ("https://ollama.example:443/", "https://ollama.example:443/v1"),
    ],
)
def test_ollama_honours_ollama_host(
    monkeypatch: pytest.MonkeyPatch, host: str, expected: str
) -> None:
    monkeypatch.setenv("OLLAMA_HOST", host)
    assert openai_model("ollama:qwen2.5:0.5b").base_url == expected


@pytest.mark.parametrize(
    ("spec", "base_url"),
    [
        ("vllm:Qwen/Qwen2.5-7B-Instruct", "http://localhost:8000/v1"),
        ("llamacpp:local", "http://localhost:8080/v1"),
        ("lmstudio:phi-4", "http://localhost:1234/v1"),
        ("ollama:llama3.2:3b@http://gpu-box:11434/v1", "http://gpu-box:11434/v1"),
        ("openai-compatible:my-model@http://localhost:9000/v1", "http://localhost:9000/v1"),
    ],
)
def test_local_servers_and_urls_in_the_string(spec: str, base_url: str) -> None:
    model = openai_model(spec)
    assert model.base_url == base_url
    assert "@" not in model.model


def test_openai_compatible_needs_a_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelError, match=r"needs a base URL.*OPENAI_BASE_URL"):
        infer_model("openai-compatible:my-model")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:9000/v1")
    assert openai_model("openai-compatible:my-model").base_url == "http://localhost:9000/v1"
    explicit = openai_model("openai-compatible:my-model", base_url="http://other:1/v1")
    assert explicit.base_url == "http://other:1/v1"


@pytest.mark.parametrize("spec", ["gpt-4o-mini", "anthropic:claude", "openai:", ":x", ""])
def test_bad_strings_list_the_accepted_forms(spec: str) -> None:
    with pytest.raises(ModelError) as raised:
        infer_model(spec)
    message = str(raised.value)
    assert "accepted forms" in message
    assert "'ollama:MODEL'" in message
    assert "'openai-compatible:MODEL@BASE_URL'" in message
    if spec == "gpt-4o-mini":
        assert "did you mean 'openai:gpt-4o-mini'" in message


def test_no_model_configured() -> None:
    with pytest.raises(ModelError, match=r"no model configured.*MINIONS_MODEL"):
        infer_model()
    with pytest.raises(ModelError, match="not int"):
        infer_model(42)  # type: ignore[call-overload]


def test_a_model_object_passes_through() -> None:
    model = ScriptedModel(["x"])
    assert infer_model(model) is model


async def test_minions_model_env_and_agent_context_strings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with FakeOpenAIServer(["from env", "from string"]) as server:
        monkeypatch.setenv("MINIONS_MODEL", f"openai-compatible:fake-model@{server.url}")
        from_env = await StepExecutor(DefaultStep("a", "go"), AgentContext(config=FAST)).execute()
        context = AgentContext(model=f"ollama:fake-model@{server.url}", config=FAST)
        from_string = await StepExecutor(DefaultStep("b", "go"), context).execute()
        requests = server.chat_requests

    assert (from_env.status, from_string.status) == (StepStatus.COMPLETED,) * 2
    assert (from_env.output, from_string.output) == ("from env", "from string")
    assert [r.model for r in requests] == ["fake-model", "fake-model"]
    assert context.model.name == "ollama:fake-model"


async def test_local_servers_never_get_the_openai_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real-openai-key-123")
    async with FakeOpenAIServer(["ok", "ok"]) as server:
        await StepExecutor(
            DefaultStep("a", "go"), AgentContext(model=f"ollama:m@{server.url}", config=FAST)
        ).execute()
        await StepExecutor(
            DefaultStep("b", "go"),
            AgentContext(model=f"openai-compatible:m@{server.url}", config=FAST),
        ).execute()
        ollama, compatible = (r.headers["authorization"] for r in server.chat_requests)
    assert "sk-real-openai-key-123" not in ollama
    assert compatible == "Bearer sk-real-openai-key-123"


async def test_azure_deployment(monkeypatch: pytest.MonkeyPatch) -> None:
    async with FakeOpenAIServer(["from azure"]) as server:
        endpoint = server.url.removesuffix("/v1")
        monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", endpoint)
        monkeypatch.setenv("AZURE_OPENAI_API_KEY", "azure-key-0000000")
        monkeypatch.setenv("OPENAI_API_VERSION", "2024-10-21")
        model = openai_model("azure:my-gpt")
        execution = await StepExecutor(
            DefaultStep("a", "go"), AgentContext(model=model, config=FAST)
        ).execute()
        (request,) = server.chat_requests
    assert execution.output == "from azure"
    assert request.path == "/openai/deployments/my-gpt/chat/completions"
    assert request.headers["api-key"] == "azure-key-0000000"
    assert "azure-key" not in repr(model)


def test_models_and_testing_load_no_provider_packages() -> None:
    # `import minions` is checked in test_public_api; the provider modules load on first use.
    code = (
        "import sys, minions.models, minions.testing; "
        "heavy = ['openai', 'instructor', 'httpx2', 'structlog', 'jmespath', 'yaml', 'pydantic']; "
        "print([m for m in heavy if m in sys.modules])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
