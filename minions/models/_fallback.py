"""`FallbackModel`: the next model when one is down (connection errors, 5xx, 429)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from minions.errors import ModelError, is_transient
from minions.models._base import Model, TokenCallback

if TYPE_CHECKING:
    from minions._messages import ModelCallResponse, Prompt

__all__ = ["FallbackModel"]


def is_fallback(model: object) -> bool:
    """Whether `model` is a `FallbackModel`: `isinstance` without `ABCMeta`'s dispatch, which
    costs a step a microsecond each time it is asked."""
    return FallbackModel in type(model).__mro__


class FallbackModel(Model):
    """Several models tried in order: the next one when one is down.

    In a step (and a model choosing the next step), each model gets the step's retries for
    transient errors (timeouts, connection errors, 429, 5xx: `ExecutionConfig.max_model_retries`,
    with backoff and ``Retry-After``); when they are spent, the next model is tried, with its
    own retries. Other errors (a 400, a refused key, an answer that fails its schema) are not
    the endpoint being down, and do not fall through: the step fails, or re-asks, as with one
    model. Once a model answered, the rest of the step stays with it; the next step starts
    with the first model again. Each attempt's `ModelCall` and `ModelCallStarted` event name
    the model and endpoint that were called. What an endpoint taught the structured-output
    ladder stays with that endpoint's model.

    A recipe names one with a list: ``model: [ollama:llama3.2:3b, openai:gpt-4o-mini]``
    (at the top or on a step).

    Called on its own (`call`), each model is tried once, in order, falling through on the
    same errors.

    Args:
        *models: the models to try, in order: `Model` objects or model strings
            (``"ollama:llama3.2:3b"``), resolved like any model string of a run (strings
            when a run uses them, by its model resolver; otherwise on first use). A
            `FallbackModel` among them adds its own models in its place.

    Raises:
        ModelError: no model is given, or one is neither a `Model` nor a model string.
    """

    def __init__(self, *models: Model | str) -> None:
        flat: list[Model | str] = []
        for index, model in enumerate(models):
            if isinstance(model, FallbackModel):
                flat += model.models
            elif isinstance(model, Model) or (isinstance(model, str) and model.strip()):
                flat.append(model)
            else:
                raise ModelError(
                    f"FallbackModel's model {index + 1} must be a Model or a model string "
                    f"('ollama:llama3.2:3b'), not {model!r}"
                )
        if not flat:
            raise ModelError(
                "FallbackModel needs at least one model: the models to try in order, e.g. "
                "FallbackModel('ollama:llama3.2:3b', 'openai:gpt-4o-mini')"
            )
        self.models: tuple[Model | str, ...] = tuple(flat)
        """The models to try, in order, as given."""
        self.name = "fallback:" + ",".join(m if isinstance(m, str) else m.name for m in flat)
        self._resolved: tuple[Model, ...] | None = None

    def __repr__(self) -> str:
        return f"FallbackModel({', '.join(repr(m) for m in self.models)})"

    def resolved(self, resolve: Callable[[str], Model] | None = None) -> tuple[Model, ...]:
        """The models, model strings made into models (by `resolve`, else `infer_model`, once).

        Raises:
            ModelError: a model string is not one (`infer_model`'s error, naming it).
        """
        if resolve is not None:
            return tuple(resolve(m) if isinstance(m, str) else m for m in self.models)
        if self._resolved is None:
            from minions.models._infer import infer_model

            self._resolved = tuple(infer_model(m) for m in self.models)
        return self._resolved

    def with_models(self, models: Sequence[Model]) -> FallbackModel:
        """The same fallback over other models (the resolved, wrapped ones of a run)."""
        return FallbackModel(*models)

    async def call(
        self, prompt: Prompt, *, on_token: TokenCallback | None = None
    ) -> ModelCallResponse:
        """Ask each model once, in order, until one answers.

        Raises:
            Exception: the last model's error, or the first error that is not transient.
        """
        models = self.resolved()
        for model in models[:-1]:
            try:
                return await model.call(prompt, on_token=on_token)
            except Exception as exc:
                if not is_transient(exc):
                    raise
        return await models[-1].call(prompt, on_token=on_token)

    async def check(self) -> None:
        """Pass when one of the models can be called.

        Raises:
            ModelError: none can, with each one's reason.
        """
        failures = []
        for model in self.resolved():
            try:
                await model.check()
            except ModelError as exc:
                failures.append(f"{model.name}: {exc}")
                continue
            return
        raise ModelError("no model of the fallback can be called: " + "; ".join(failures))
