"""RecipeStep: run a whole recipe as one step of another."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Unpack

from minions._messages import Message, ModelCallResponse, Prompt
from minions._step.execution import StepStatus
from minions._step.run import StepRun
from minions._step.step import Step, StepInput
from minions._templates import render
from minions.models import Model

if TYPE_CHECKING:
    from minions._step.context import AgentContext
    from minions._step.step import StepOptions
    from minions.recipes._recipe import AgentRecipe

__all__ = ["RecipeStep"]


class _Scoped(Model):
    """A model whose prompts are scoped under the parent step, so a recording of the parent run
    keys the inner recipe's calls apart from the outer ones."""

    def __init__(self, inner: Model, prefix: str) -> None:
        self.inner = inner
        self.prefix = prefix
        self.name = getattr(inner, "name", type(inner).__name__)

    @property
    def endpoint(self) -> tuple[str, str] | None:
        return self.inner.endpoint

    async def check(self) -> None:
        await self.inner.check()

    async def call(
        self, prompt: Prompt, *, on_token: Callable[[str], None] | None = None
    ) -> ModelCallResponse:
        scope = prompt.scope or prompt.step_id
        scoped = dataclasses.replace(prompt, scope=f"{self.prefix}/{scope}")
        return await self.inner.call(scoped, on_token=on_token)


class RecipeStep(Step):
    """Runs another recipe as one step; its output is that run's output.

    The inner run uses the outer run's settings (`RunSettings`: the model, unless this step or
    the inner recipe names its own, the model resolver and wrapper, approver and tracer), its
    memory, configuration and remaining token budget; its usage counts in this step's and the
    outer run's usage, and its step executions are this step's `items` (its events do not go
    to the outer run's listeners).

    Args:
        id: the step's id.
        recipe: the recipe to run.
        inputs: the inner run's inputs; values may be ``{{ templates }}`` over the outer run.
        **options: the `Step` options.
    """

    kind: ClassVar[str] = "recipe"

    def __init__(
        self,
        id: str,
        recipe: AgentRecipe,
        *,
        inputs: Mapping[str, Any] | None = None,
        **options: Unpack[StepOptions],
    ) -> None:
        options.setdefault("description", recipe.description)
        super().__init__(id, **options)
        self.recipe = recipe
        self.inputs = dict(inputs or {})

    def templates(self) -> Mapping[str, Any]:
        return {"inputs": self.inputs}

    def uses_model(self) -> bool:
        # The inner run's default model is this step's (unless the recipe names its own).
        recipe = self.recipe
        return recipe.model is None and any(
            s.model is None and s.uses_model() for s in recipe.steps
        )

    def build_messages(self, step_input: StepInput) -> list[Message]:
        return []

    async def run(self, run: StepRun) -> None:
        outer = run.context
        if outer.recipe_runner is None:
            run.fail(
                f"step {self.id!r}: a recipe step runs in a run of an AgentExecutor (its "
                "context has no recipe_runner)"
            )
        inputs = render(self.inputs, run.state)
        config = outer.config
        if config.run_token_budget is not None:
            left = max(config.run_token_budget - outer.usage.total_tokens, 0)
            config = dataclasses.replace(config, run_token_budget=left)
        prefix = f"{self.id}#{run.visit}"
        # The inner run shares the outer run's settings (resolver, approver, tracer...), with
        # this step's model and a wrapper that scopes its calls; its events come back as this
        # step's items, not to the outer listeners, and it connects to its own recipe's MCP
        # servers only.
        settings = dataclasses.replace(
            outer.settings,
            model=self.model if self.model is not None else outer.settings.model,
            model_wrapper=_wrapper(outer, prefix),
            listeners=(),
            mcp_servers={},
        )
        result = await outer.recipe_runner(
            self.recipe,
            inputs,
            run_id=f"{outer.run_id}.{self.id}",
            settings=settings,
            memory=outer.memory,
            config=config,
            deps=outer.deps,
        )
        run.absorb(result.executions, items=True)  # routing calls are in their step's execution
        outer.record_usage(result.usage)
        if result.status is not StepStatus.COMPLETED:
            run.fail(f"recipe {self.recipe.id!r} failed: {result.error}", output=result.output)
        run.complete(result.output)


def _wrapper(outer: AgentContext, prefix: str) -> Callable[[Model], Model]:
    def wrap(model: Model) -> Model:
        return _Scoped(outer.wrap_model(model), prefix)

    return wrap
