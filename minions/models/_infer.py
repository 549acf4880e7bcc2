"""Model strings: from ``"ollama:llama3.2"`` to a `Model`."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any, Final, TypeVar, overload

from minions.errors import ModelError, did_you_mean
from minions.models._base import Model

if TYPE_CHECKING:
    from minions.models._openai import OpenAIChatModel

__all__ = ["MODEL_ENV", "infer_model"]

MODEL_ENV: Final = "MINIONS_MODEL"

LOCAL_SERVERS: Final = {
    "ollama": "http://localhost:11434/v1",
    "vllm": "http://localhost:8000/v1",
    "llamacpp": "http://localhost:8080/v1",
    "lmstudio": "http://localhost:1234/v1",
}
"""Default base URLs of the local servers a model string can name."""

FORMS: Final = (
    "'openai:MODEL' (key from OPENAI_API_KEY, endpoint from OPENAI_BASE_URL if set), "
    + "".join(
        f"'{name}:MODEL' ({url}{', or OLLAMA_HOST' if name == 'ollama' else ''}), "
        for name, url in LOCAL_SERVERS.items()
    )
    + "'openai-compatible:MODEL@BASE_URL' (or with OPENAI_BASE_URL set), "
    "'azure:DEPLOYMENT' (AZURE_OPENAI_ENDPOINT, AZURE_OPENAI_API_KEY, OPENAI_API_VERSION); "
    "any form may end in '@BASE_URL', e.g. 'ollama:llama3.2:3b@http://gpu-box:11434/v1'"
)

_WITH_URL = re.compile(r"^(?P<name>.+?)@(?P<url>https?://\S+)$")


_M = TypeVar("_M", bound=Model)


@overload
def infer_model(spec: _M, **options: Any) -> _M: ...
@overload
def infer_model(spec: str | None = None, **options: Any) -> OpenAIChatModel: ...
def infer_model(spec: str | Model | None = None, **options: Any) -> Model:
    """Turn a model string such as ``"openai:gpt-4o-mini"`` into a `Model`.

    With no `spec`, the `MINIONS_MODEL` environment variable is used. The accepted forms are
    listed in `FORMS`; `options` go to `OpenAIChatModel` (``base_url``, ``api_key``,
    ``stream``, ``timeout``, ``settings``, ``output_modes``) and win over the string.

    Local servers (Ollama, vLLM, llama.cpp, LM Studio) get no API key unless one is passed,
    so an OpenAI key in the environment is never sent to them.

    Raises:
        ModelError: no model is configured, or the string is not one of the forms.
    """
    if isinstance(spec, Model):
        return spec
    if spec is None:
        spec = os.environ.get(MODEL_ENV) or None
    if spec is None:
        # Short: a durable run's log says it on the step, then on the run.
        raise ModelError(
            f"no model configured: set {MODEL_ENV} (e.g. 'openai:gpt-4o-mini' or "
            "'ollama:llama3.2:3b'), or name one in the recipe (`model:`) or in code (model=...)"
        )
    if not isinstance(spec, str):
        raise ModelError(f"model must be a Model or a string, not {type(spec).__name__}")
    provider, name, url = _parts(spec)
    if provider not in PROVIDERS or not name:
        hint = f" (did you mean 'openai:{spec}'?)" if ":" not in spec and spec.strip() else ""
        raise ModelError(f"unknown model {spec!r}{hint}; accepted forms: {FORMS}")
    options.setdefault("provider", provider)
    if url is not None:
        options.setdefault("base_url", url)
    from minions.models._openai import NO_API_KEY, OpenAIChatModel

    if provider == "openai":
        return OpenAIChatModel(name, **options)
    if provider == "openai-compatible":
        options.setdefault("base_url", os.environ.get("OPENAI_BASE_URL"))
        if not options["base_url"]:
            raise ModelError(
                f"{spec!r} needs a base URL: write 'openai-compatible:{name}@http://HOST:PORT/v1', "
                "pass base_url=..., or set OPENAI_BASE_URL"
            )
        return OpenAIChatModel(name, **options)
    if provider == "azure":
        return _azure(name, options)
    options.setdefault("base_url", _ollama_host() if provider == "ollama" else None)
    options["base_url"] = options["base_url"] or LOCAL_SERVERS[provider]
    options["api_key"] = options.get("api_key") or NO_API_KEY
    return OpenAIChatModel(name, **options)


PROVIDERS: Final = frozenset({"openai", "openai-compatible", "azure", *LOCAL_SERVERS})
"""The providers a model string can name."""


def model_string_problem(spec: object) -> str | None:
    """What is certainly wrong with a model string written in a recipe, or `None`: it is not
    text, it is empty, or its provider is a misspelt known one (``olama:llama3.2``). Other
    names may be a model resolver's own (``cheap``), so they are left to it."""
    if not isinstance(spec, str):
        return f"a model is a model string ('ollama:llama3.2:3b'), not {spec!r}"
    if not spec.strip():
        return "a model string is empty; write one like 'ollama:llama3.2:3b'"
    provider, _, _ = _parts(spec)
    if ":" in spec and provider not in PROVIDERS:
        hint = did_you_mean(provider, sorted(PROVIDERS))
        if hint:
            return f"unknown provider {provider!r} in model {spec!r}{hint}"
    return None


def model_endpoint(spec: str) -> tuple[str, str | None]:
    """Where a model string is served: its provider (lower case) and the base URL it names
    after ``@`` (None: the provider's own, which the environment or the provider decides).
    Nothing is built or checked."""
    provider, _, url = _parts(spec)
    return provider, url


def _parts(spec: str) -> tuple[str, str, str | None]:
    """A model string's provider, model name and base URL (None when it names none)."""
    provider, _, rest = spec.strip().partition(":")
    match = _WITH_URL.match(rest)
    name, url = (match["name"], match["url"]) if match else (rest, None)
    return provider.lower(), name.strip(), url


def _ollama_host() -> str | None:
    """Ollama's own ``OLLAMA_HOST`` (``host``, ``host:port`` or a URL) as a base URL."""
    host = os.environ.get("OLLAMA_HOST", "").strip().rstrip("/")
    if not host:
        return None
    if "://" not in host:
        host = f"http://{host}"
    if not re.search(r":\d+$", host):
        host += ":11434"
    return f"{host}/v1"


def _azure(deployment: str, options: dict[str, Any]) -> OpenAIChatModel:
    import openai

    from minions.models._openai import OpenAIChatModel

    client_options = {key: options.pop(key) for key in ("api_key", "api_version") if key in options}
    endpoint = options.pop("base_url", None)
    timeout = options.get("timeout", 600.0)

    def client() -> openai.AsyncOpenAI:
        return openai.AsyncAzureOpenAI(
            azure_endpoint=endpoint, max_retries=0, timeout=timeout, **client_options
        )

    try:
        return OpenAIChatModel(deployment, client=client, **options)
    except openai.OpenAIError as exc:
        raise ModelError(f"azure:{deployment}: {exc}") from None
