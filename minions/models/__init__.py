"""Models: the `Model` interface and the providers that implement it.

Providers are imported lazily, so `import minions` never pays for the `openai` package.
"""

from __future__ import annotations

import os

from minions.errors import ModelError
from minions.models.base import Model, TokenCallback

__all__ = ["Model", "TokenCallback", "infer_model"]

MODEL_ENV = "MINIONS_MODEL"


def infer_model(spec: str | Model | None = None) -> Model:
    """Turn a model string such as ``"openai:gpt-4o-mini"`` into a `Model`.

    With no `spec`, the `MINIONS_MODEL` environment variable is used.

    Raises:
        ModelError: no model is configured, or the string names no known provider.
    """
    if isinstance(spec, Model):
        return spec
    if spec is None:
        spec = os.environ.get(MODEL_ENV) or None
    if spec is None:
        raise ModelError(
            "no model configured: pass model=... (a Model or a string such as "
            f"'openai:gpt-4o-mini' or 'ollama:llama3.2:3b') or set {MODEL_ENV}"
        )
    raise ModelError(f"unknown model {spec!r}: no provider is available for it")
