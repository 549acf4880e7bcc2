"""From an `AgentRecipe` built in Python back to the YAML recipe format."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from minions._config import ExecutionConfig
from minions._kinds.analysis import ANALYSIS_CONFIG, ANALYSIS_SYSTEM, AnalysisStep
from minions._kinds.loop import LoopStep
from minions._kinds.task import TaskStep
from minions._kinds.tool import ToolStep
from minions._step.agent import DefaultStep
from minions._step.step import Step
from minions.errors import Problem, RecipeError
from minions.models import FallbackModel, Model
from minions.recipes._schema import StepSpec
from minions.tools import builtin_tools

if TYPE_CHECKING:
    from minions.recipes._recipe import AgentRecipe

__all__ = ["dump_recipe"]


def to_yaml_text(data: Mapping[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(dict(data), sort_keys=False, allow_unicode=True, width=100)


def dump_recipe(recipe: AgentRecipe) -> str:
    """The recipe in the YAML format: `parse_recipe` of it gives the same recipe.

    A recipe loaded from YAML writes back what it was loaded from.

    Raises:
        RecipeError: naming each part with no YAML form (a Python condition, a model object, a
            custom step class, a tool that cannot be imported by name).
    """
    if recipe.source is not None:
        return to_yaml_text(recipe.source.spec.model_dump(mode="json", exclude_defaults=True))
    return to_yaml_text(recipe_to_data(recipe))


def model_data(model: Model | str) -> str | list[str] | None:
    """A model's YAML form: its string, or a fallback's list of strings; `None` for a model
    object, which has none."""
    if isinstance(model, str):
        return model
    if isinstance(model, FallbackModel) and all(isinstance(m, str) for m in model.models):
        return [str(m) for m in model.models]
    return None


def recipe_to_data(recipe: AgentRecipe) -> dict[str, Any]:
    """The YAML form of `recipe`, as plain data.

    Raises:
        RecipeError: naming every part that has no YAML form (a Python condition, a model
            object, a custom step class, a tool defined where it cannot be imported).
    """
    problems: list[Problem] = []

    def problem(message: str, step: str | None = None, field: str | None = None) -> None:
        problems.append(Problem(message=message, step=step, field=field))

    data: dict[str, Any] = {"id": recipe.id}
    if recipe.description:
        data["description"] = recipe.description
    if recipe.model is not None:
        named = model_data(recipe.model)
        if named is not None:
            data["model"] = named
        else:
            problem("a model object has no YAML form; use a model string", field="model")
    config = _config(recipe.config)
    if config:
        data["config"] = config
    if recipe.execution_mode != "planned":
        data["execution_mode"] = recipe.execution_mode
    inputs = dict(recipe.input_specs) or {
        name: {"default": value} for name, value in recipe.inputs.items()
    }
    if inputs:
        data["inputs"] = {
            name: spec.model_dump(exclude_defaults=True) if hasattr(spec, "model_dump") else spec
            for name, spec in inputs.items()
        }
    tools = []
    builtins = {t.name for t in builtin_tools(http=True)}
    for tool in recipe.tools:
        name = getattr(tool, "name", getattr(tool, "__name__", ""))
        if name in builtins:
            continue
        function = getattr(tool, "fn", tool)
        module = getattr(function, "__module__", None)
        qualname = getattr(function, "__qualname__", "")
        if (
            not module
            or module == "__main__"
            or "<locals>" in qualname
            or module.startswith("_minions_recipe_")
        ):
            problem(
                f"tool {name!r} is defined where a recipe file cannot import it "
                f"({module}.{qualname}); define it in an importable module",
                field="tools",
            )
            continue
        tools.append(f"{module}:{qualname}")
    if tools:
        data["tools"] = tools
    servers = _mcp_servers(recipe.mcp_servers, problem)
    if servers:
        data["mcp_servers"] = servers
    aliases = {step_id: alias for alias, step_id in recipe.aliases.items()}
    nexts: dict[str, list[dict[str, Any]]] = {}
    for transition in recipe.transitions:
        entry: dict[str, Any] = {"step": transition.target}
        if transition.when is not None:
            if isinstance(transition.when, str):
                entry["when"] = transition.when
            else:
                problem(
                    f"the condition of {transition} is a Python callable; YAML needs an expression",
                    transition.source,
                    "next",
                )
        nexts.setdefault(transition.source, []).append(entry)
    steps = []
    for step in recipe.steps:
        try:
            entry = _step(step)
        except RecipeError as exc:
            problems.extend(exc.problems)
            continue
        if step.id in aliases:
            entry["save_as"] = aliases[step.id]
        if step.id in nexts:
            entry["next"] = nexts[step.id]
        steps.append(entry)
    data["steps"] = steps
    if problems:
        raise RecipeError(problems)
    return data


def _mcp_servers(servers: Mapping[str, Any], problem: Any) -> dict[str, Any]:
    """The YAML form of MCP servers. Their `env` and `headers` hold values already read from
    the environment (secrets, often): those are not written out."""
    from minions.tools import MCPHttpServer, MCPStdioServer
    from minions.tools._internal import DEFAULT_TIMEOUT

    found: dict[str, Any] = {}
    for name, server in servers.items():
        entry: dict[str, Any]
        if isinstance(server, MCPStdioServer):
            entry = {"command": server.command}
            if server.args:
                entry["args"] = list(server.args)
            if server.cwd is not None:
                entry["cwd"] = str(server.cwd)
            secret = "env" if server.env else None
        elif isinstance(server, MCPHttpServer):
            entry = {"url": server.url}
            secret = "headers" if server.headers else None
        else:
            problem(
                f"MCP server {name!r} is an in-process {type(server).__name__}, which has no "
                "YAML form",
                field="mcp_servers",
            )
            continue
        if secret is not None:
            problem(
                f"MCP server {name!r}: its {secret} values are read from the environment (and "
                f"may be secrets), so they are not written; write them in the YAML as ${{VAR}}",
                field=f"mcp_servers.{name}.{secret}",
            )
            continue
        if server.timeout != DEFAULT_TIMEOUT:
            entry["timeout"] = server.timeout
        found[name] = entry
    return found


def _options(step: Step) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if step.description:
        found["description"] = step.description
    if step.depends_on:
        found["depends_on"] = list(step.depends_on)
    for name in ("mode", "optional", "timeout", "max_visits", "memory"):
        value = getattr(step, name)
        if value != StepSpec.model_fields[name].default:
            found[name] = value
    policy = step.cache
    if policy is not None:
        found["cache"] = (
            True
            if policy.ttl is None and not policy.side_effects
            else {"ttl": policy.ttl, "side_effects": policy.side_effects}
        )
    return found


def _own(step: Step) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if step.model is not None:
        named = model_data(step.model)
        if named is None:
            raise RecipeError(
                [Problem(message="a model object has no YAML form", step=step.id, field="model")]
            )
        found["model"] = named
    config = _config(step.config)
    if config:
        found["config"] = config
    return found


def _config(config: Mapping[str, Any] | ExecutionConfig | None) -> dict[str, Any]:
    if config is None:
        return {}
    return config.overrides() if isinstance(config, ExecutionConfig) else dict(config)


def _body(step: Step) -> dict[str, Any]:
    if isinstance(step, AnalysisStep):
        body: dict[str, Any] = {"analyze": step.bundle.goal, "input": step.input}
        if step.output is not None:
            body["output"] = dict(step.output.json_schema())
        if step.bundle.system != ANALYSIS_SYSTEM:
            body["system"] = step.bundle.system
        own = _own(step)
        if own.get("config") == ANALYSIS_CONFIG:
            del own["config"]
        return {**body, **own}
    if isinstance(step, TaskStep):
        body = {"type": step.type, "goal": step.goal}
        if step.reads:
            body["reads"] = list(step.reads)
        if step.artifacts:
            body["artifacts"] = list(step.artifacts)
        if step.tools:
            body["tools"] = sorted(step.tools)
        return {**body, **_own(step)}
    if isinstance(step, DefaultStep):
        body = {"goal": step.bundle.goal}
        if step.bundle.system:
            body["system"] = step.bundle.system
        if step.tools:
            body["tools"] = sorted(step.tools)
        if step.output is not None:
            body["output"] = dict(step.output.json_schema())
        if step.completion_marker:
            body["completion_marker"] = step.completion_marker
        return {**body, **_own(step)}
    if isinstance(step, ToolStep):
        body = {"tool": step.tool}
        if step.params:
            body["params"] = dict(step.params)
        if step.fill_missing:
            body["fill_missing"] = step.fill_missing
        if step.requires_approval:
            body["requires_approval"] = True
        return {**body, **_own(step)}
    source = inspect.getmodule(type(step))
    raise RecipeError(
        [
            Problem(
                message=(
                    f"a {type(step).__name__} (from {getattr(source, '__name__', '?')}) has no "
                    "YAML form"
                ),
                step=step.id,
            )
        ]
    )


def _step(step: Step) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": step.id}
    if isinstance(step, LoopStep):
        entry.update(_body(step.body))
        entry.update(_options(step))
        loop: dict[str, Any] = {"items": step.items}
        if step.parallel != 1:
            loop["parallel"] = step.parallel
        if step.continue_on_error:
            loop["continue_on_error"] = True
        entry["loop"] = loop
        return entry
    entry.update(_body(step))
    entry.update(_options(step))
    return entry
