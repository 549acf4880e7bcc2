"""`Plan` and `PlanStep`: what a planner answers with (structured output), and how a plan
becomes a recipe (`to_recipe`) or a YAML file a person can edit (`to_yaml`)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from minions._kinds.task import TaskStep, TaskType
from minions._step.step import MAX_ID_LENGTH, recipe_id_problem, step_id_problem
from minions.errors import PlanError, Problem
from minions.recipes import AgentRecipe, recipe_problems
from minions.tools import Tool, ToolRegistry, builtin_tools

__all__ = ["Plan", "PlanStep", "TokenLine"]

ToolLike = Tool | Callable[..., Any]

_NOT_IN_ID = re.compile(r"[^A-Za-z0-9_-]+")


def _bounded(slug: str, whole: str, joiner: str) -> str:
    """`slug` cut to the id length, with a hash of `whole` when cut (two long names stay
    apart)."""
    if len(slug) <= MAX_ID_LENGTH:
        return slug
    digest = hashlib.sha1(whole.encode()).hexdigest()[:8]
    return f"{slug[: MAX_ID_LENGTH - 9]}{joiner}{digest}"


def step_slug(text: str) -> str:
    """A step id for what a planner called a step: the text itself when it is one, else a
    slug of it (``Write tests`` -> ``write_tests``). The same text always gives the same id,
    so ``depends_on`` keeps naming the step."""
    if step_id_problem(text) is None:
        return text
    slug = _NOT_IN_ID.sub("_", text.strip()).strip("_-").lower()
    if not slug or not (slug[0].isalpha() or slug[0] == "_"):
        slug = f"step_{slug}".rstrip("_")
    return _bounded(slug, text, "_")


def recipe_slug(text: str) -> str:
    """A recipe id for what a planner called its plan: the text itself when it is one, else a
    slug of it (``User management`` -> ``user-management``; ``plan`` when nothing is left)."""
    if recipe_id_problem(text) is None:
        return text
    slug = _NOT_IN_ID.sub("-", text.strip()).strip("_-").lower() or "plan"
    return _bounded(slug, text, "-")


@dataclass(frozen=True, kw_only=True)
class TokenLine:
    """The tokens of one part of a planned run: the planner, a replan, or a step.

    Attributes:
        name: ``planner``, ``replan 1``..., or the step id.
        part: ``planner``, ``replan`` or ``step``.
        prompt_tokens: tokens sent.
        completion_tokens: tokens received.
        calls: model calls (retries and re-asks included).
        source: ``reported`` (by the provider, for every call), ``estimated`` (characters / 4
            on the exact messages, for every call: the provider did not say) or ``mixed``.
        status: for a step, how it ended (``completed``, ``failed``, ``skipped``).
    """

    name: str
    part: Literal["planner", "replan", "step"]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    source: Literal["reported", "estimated", "mixed"] = "reported"
    status: str = "completed"

    @property
    def total_tokens(self) -> int:
        """Prompt and completion tokens together."""
        return self.prompt_tokens + self.completion_tokens


class PlanStep(BaseModel):
    """One step of a plan."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="A short unique id: letters, digits, '_' or '-'.")
    type: TaskType = Field(description="What the step does.")
    goal: str = Field(description="What the step must do, said so it can be done alone.")
    inputs: list[str] = Field(
        default_factory=list,
        description="Workspace files whose content the step needs (only those).",
    )
    depends_on: list[str] = Field(
        default_factory=list, description="Ids of earlier steps whose artifacts it needs."
    )
    artifacts: list[str] = Field(
        default_factory=list, description="What it produces: file paths, or names of results."
    )
    tools: list[str] = Field(
        default_factory=list, description="Tools it may call, from those offered (often none)."
    )

    @field_validator("id", mode="before")
    @classmethod
    def _slug(cls, value: Any) -> Any:
        # A model's "Step 1" becomes step_1 rather than a plan sent back.
        return step_slug(value) if isinstance(value, str) else value

    @field_validator("depends_on", mode="before")
    @classmethod
    def _slugs(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [step_slug(v) if isinstance(v, str) else v for v in value]
        return value


class Plan(BaseModel):
    """A plan: typed steps, each run with only its goal, its inputs and its dependencies'
    artifacts.

    A planner answers with one (`PlanGenerator.generate`); `to_recipe` makes it an
    `AgentRecipe` checked like any recipe, and `to_yaml` a YAML recipe a person can review,
    edit and run with ``minions run``.
    """

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="A short name for the plan, e.g. 'user-management'.")
    description: str = Field(description="What the plan achieves, in one sentence.")
    steps: list[PlanStep] = Field(min_length=1, description="The steps, in a workable order.")
    _tokens: list[TokenLine] = PrivateAttr(default_factory=list)

    @field_validator("id", mode="before")
    @classmethod
    def _slug(cls, value: Any) -> Any:
        # The id becomes the recipe's, which must be a slug: made one, not refused.
        return recipe_slug(value) if isinstance(value, str) else value

    @property
    def tokens(self) -> tuple[TokenLine, ...]:
        """The planner's tokens for this plan (the first plan, and any re-ask)."""
        return tuple(self._tokens)

    def step(self, step_id: str) -> PlanStep:
        """The step with this id.

        Raises:
            KeyError: no step has it.
        """
        for step in self.steps:
            if step.id == step_id:
                return step
        raise KeyError(step_id)

    def problems(
        self,
        *,
        tools: Sequence[ToolLike] = (),
        allowed_tools: Sequence[str] | None = None,
        workspace: str | Path | None = None,
    ) -> list[Problem]:
        """Everything wrong with the plan as a recipe (duplicate or malformed ids, unknown
        dependencies, cycles, unknown tools), each naming the step and field; with a
        `workspace`, also every input that is neither a file there nor an artifact of a step
        it waits for."""
        problems = recipe_problems(
            self._recipe(None, tools), ToolRegistry(self._tools(None, tools))
        )
        if workspace is not None:
            problems.extend(self._input_problems(Path(workspace)))
        if allowed_tools is not None:
            allowed = set(allowed_tools)
            for step in self.steps:
                for name in step.tools:
                    if name not in allowed:
                        known = ", ".join(sorted(allowed)) or "none"
                        problems.append(
                            Problem(
                                message=f"tool {name!r} is not one the plan may use ({known})",
                                step=step.id,
                                field="tools",
                            )
                        )
        return list(dict.fromkeys(problems))

    def _input_problems(self, root: Path) -> list[Problem]:
        steps = {s.id: s for s in self.steps}
        found = []
        for step in self.steps:
            before: set[str] = set()
            waiting = list(step.depends_on)
            while waiting:
                current = waiting.pop()
                if current in before or current not in steps:
                    continue
                before.add(current)
                waiting.extend(steps[current].depends_on)
            made = {a for s in before for a in steps[s].artifacts}
            for path in step.inputs:
                if path not in made and not (root / path).is_file():
                    found.append(
                        Problem(
                            message=f"input {path!r} is not a file of the workspace, nor an "
                            "artifact of a step it depends on",
                            step=step.id,
                            field="inputs",
                        )
                    )
        return found

    def to_recipe(
        self, *, workspace: str | Path | None = None, tools: Sequence[ToolLike] = ()
    ) -> AgentRecipe:
        """The plan as an `AgentRecipe` of `TaskStep`s, validated like any recipe.

        Args:
            workspace: the folder the steps read their inputs from and write their files to
                (through the file tools); the current directory by default.
            tools: tools the steps may call, besides the built-in ones.

        Raises:
            PlanError: every problem of the plan, each naming the step and field.
        """
        recipe = self._recipe(workspace, tools)
        problems = recipe_problems(recipe, ToolRegistry(recipe.tools))
        if problems:
            raise PlanError(problems)
        return recipe

    def to_yaml(
        self,
        *,
        workspace: str | Path | None = None,
        tools: Sequence[ToolLike] = (),
        references: Sequence[str] = (),
    ) -> str:
        """The plan as a YAML recipe (task steps) that ``minions run`` runs.

        Args:
            workspace: written as the recipe's ``workspace:`` (relative paths are relative to
                the YAML file); without it, ``minions run --workspace DIR`` says where.
            tools: tools the steps may call, written as ``module:function`` references.
            references: written as the recipe's ``tools:`` instead (``package.module`` or
                ``package.module:function``, as ``minions plan --tools`` takes them); `tools`
                then only checks the plan.

        Raises:
            PlanError: the plan is invalid.
            RecipeError: a tool has no importable name.
        """
        from minions.recipes._internal import recipe_to_data, to_yaml_text

        recipe = self.to_recipe(workspace=workspace, tools=tools)
        data = recipe_to_data(self._recipe(workspace, ()) if references else recipe)
        steps = data.pop("steps")
        if references:
            data["tools"] = list(references)
        if workspace is not None:
            data["workspace"] = str(workspace)
        data["steps"] = steps
        head = (
            "# A plan made by `minions plan`: review it, edit it, then `minions run` it.\n"
            "# Each step sees only its goal, the files it `reads` and the artifacts of its\n"
            "# `depends_on` steps (docs/plans.md).\n"
        )
        return head + to_yaml_text(data)

    def _tools(self, workspace: str | Path | None, tools: Sequence[ToolLike]) -> list[ToolLike]:
        root = Path(workspace) if workspace is not None else Path.cwd()
        own = {getattr(t, "name", getattr(t, "__name__", "")) for t in tools}
        return [*tools, *(t for t in builtin_tools(root) if t.name not in own)]

    def _recipe(self, workspace: str | Path | None, tools: Sequence[ToolLike]) -> AgentRecipe:
        steps = [
            TaskStep(
                step.id,
                step.goal,
                type=step.type,
                reads=step.inputs,
                artifacts=step.artifacts,
                tools=step.tools,
                depends_on=step.depends_on,
            )
            for step in self.steps
        ]
        return AgentRecipe(
            id=self.id,
            description=self.description,
            steps=steps,
            tools=self._tools(workspace, tools),
        )
