"""From a checked `RecipeSpec` to an `AgentRecipe`, and back to YAML."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from minions._kinds.analysis import AnalysisStep
from minions._kinds.example import schema_from_example
from minions._kinds.loop import LoopStep
from minions._kinds.tool import ToolStep
from minions._messages import MessageBundle
from minions._output import OutputInstructions
from minions._routing.transition import Transition
from minions._step.step import DefaultStep, Step
from minions.errors import MinionsError, Problem, RecipeError
from minions.recipes._loader import load_spec, parse_spec
from minions.recipes._recipe import AgentRecipe
from minions.recipes._schema import HttpSpec, RecipeSpec, StepSpec
from minions.recipes._source import Located
from minions.recipes._subrecipe import RecipeStep
from minions.recipes._validation import recipe_problems
from minions.tools._builtin import builtin_tools
from minions.tools._tool import Tool, ToolRegistry

__all__ = ["RecipeFile", "load_recipe", "load_recipe_file", "parse_recipe"]


@dataclass(frozen=True, kw_only=True)
class RecipeFile:
    """A recipe loaded from YAML: the `AgentRecipe`, its spec, and where it came from."""

    recipe: AgentRecipe
    spec: RecipeSpec
    path: Path | None
    located: Located


def load_recipe_file(path: str | Path, *, _stack: tuple[Path, ...] = ()) -> RecipeFile:
    """Load, check and build a YAML recipe file.

    Raises:
        RecipeError: every problem found, each with file, line, step and field.
    """
    file = Path(path).resolve()
    if file in _stack:
        chain = " -> ".join(p.name for p in (*_stack, file))
        raise RecipeError([Problem(message=f"recipes include each other: {chain}", file=str(path))])
    spec, located = load_spec(path)
    return build_recipe(spec, located, base=file.parent, path=file, stack=(*_stack, file))


def load_recipe(path: str | Path) -> AgentRecipe:
    """Load a YAML recipe file (see docs/recipes.md) into an `AgentRecipe`.

    Raises:
        RecipeError: every problem in the file, each with file, line, step and field.
    """
    return load_recipe_file(path).recipe


def parse_recipe(text: str, *, base: str | Path = ".") -> AgentRecipe:
    """An `AgentRecipe` from YAML text; relative paths (tools, workspace, sub-recipes) are
    resolved from `base`.

    Raises:
        RecipeError: every problem in the text, each with line, step and field.
    """
    spec, located = parse_spec(text)
    return build_recipe(spec, located, base=Path(base).resolve()).recipe


def build_recipe(
    spec: RecipeSpec,
    located: Located,
    *,
    base: Path,
    path: Path | None = None,
    stack: tuple[Path, ...] = (),
) -> RecipeFile:
    """Build the `AgentRecipe` a spec describes, and check it whole."""
    problems: list[Problem] = []

    def problem(message: str, index: int | None = None, field: str | None = None) -> None:
        step = spec.steps[index].id if index is not None else None
        where: tuple[str | int, ...] = ("steps", index) if index is not None else ()
        if field is not None:
            where = (*where, *(int(p) if p.isdigit() else p for p in field.split(".")))
        problems.append(
            Problem(
                message=message,
                file=located.file,
                line=located.line(where),
                step=step,
                field=field,
            )
        )

    tools = _tools(spec, base, problem)
    steps: list[Step] = []
    transitions = []
    aliases: dict[str, str] = {}
    for index, step_spec in enumerate(spec.steps):
        try:
            steps.append(_step(step_spec, base, stack))
        except RecipeError as exc:
            for p in exc.problems:
                problem(f"in {p.file}: {p}" if p.file else p.message, index, "recipe")
        except MinionsError as exc:
            for message in getattr(exc, "problems", [str(exc)]):
                problem(message.removeprefix(f"step {step_spec.id!r}: "), index)
        for target in step_spec.next:
            transitions.append(Transition(step_spec.id, target.step, when=target.when))
        if step_spec.save_as is not None:
            if step_spec.save_as in aliases:
                problem(f"save_as {step_spec.save_as!r} is used twice", index, "save_as")
            aliases[step_spec.save_as] = step_spec.id
    config = dict(spec.config)
    defaults = {name: i.default for name, i in spec.inputs.items() if i.default is not None}
    if len(steps) < len(spec.steps):
        raise RecipeError(problems)  # the recipe checks below need every step
    recipe = AgentRecipe(
        id=spec.id,
        description=spec.description,
        steps=steps,
        transitions=transitions,
        model=spec.model,
        config=config,
        inputs=defaults,
        tools=tools,
        aliases=aliases,
        input_specs=spec.inputs,
        execution_mode=spec.execution_mode,
    )
    for issue in recipe_problems(recipe, ToolRegistry(tools)):
        at = next((i for i, s in enumerate(spec.steps) if s.id == issue.step), None)
        field = _yaml_field(issue.field)
        if field == "tools" and at is not None and spec.steps[at].kind == "tool":
            field = "tool"
        problem(issue.message, at, field)
    if problems:
        unique = list(dict.fromkeys(problems))
        raise RecipeError(sorted(unique, key=lambda p: (p.file or "", p.line or 0)))
    loaded = RecipeFile(recipe=recipe, spec=spec, path=path, located=located)
    object.__setattr__(recipe, "source", loaded)
    return loaded


def _yaml_field(field: str | None) -> str | None:
    """The YAML name of a field a recipe check names."""
    if field is None:
        return None
    head, _, rest = field.partition(".")
    renamed = {"bundle": "goal", "transitions": "next", "items": "loop", "aliases": "save_as"}
    return renamed.get(head, head) + (f".{rest}" if rest else "")


def _options(spec: StepSpec) -> dict[str, Any]:
    return {
        "description": spec.description,
        "depends_on": spec.depends_on,
        "mode": spec.mode,
        "optional": spec.optional,
        "timeout": spec.timeout,
        "max_visits": spec.max_visits,
        "memory": spec.memory,
    }


def _body(spec: StepSpec, base: Path, stack: tuple[Path, ...], options: dict[str, Any]) -> Step:
    own: dict[str, Any] = {"model": spec.model, "config": spec.config or None, **options}
    output = spec.output if spec.output is not None else spec.output_format
    if spec.kind == "agent":
        assert spec.goal is not None
        return DefaultStep(
            spec.id,
            MessageBundle(goal=spec.goal, system=spec.system),
            tools=spec.tools,
            output=_instructions(spec.id, output),
            completion_marker=spec.completion_marker,
            **own,
        )
    if spec.kind == "analysis":
        goal = spec.analyze if spec.analyze is not None else spec.context
        if goal:
            own["goal"] = goal
        return AnalysisStep(
            spec.id,
            input=spec.input,
            output=output if output is not None else {"result": ""},
            system=spec.system,
            **own,
        )
    if spec.kind == "tool":
        assert spec.tool is not None
        return ToolStep(spec.id, spec.tool, spec.params, fill_missing=spec.fill_missing, **own)
    assert spec.recipe is not None
    child = load_recipe_file(base / spec.recipe, _stack=stack)
    return RecipeStep(spec.id, child.recipe, inputs=spec.inputs, **own)


def _step(spec: StepSpec, base: Path, stack: tuple[Path, ...]) -> Step:
    if spec.loop is None:
        return _body(spec, base, stack, _options(spec))
    # The loop carries the scheduling options; the body runs once per item.
    body = _body(spec, base, stack, {"description": spec.description})
    return LoopStep(
        body,
        spec.loop.items,
        parallel=spec.parallel or spec.loop.parallel,
        continue_on_error=spec.loop.continue_on_error,
        **_options(spec),
    )


def _instructions(step_id: str, output: Any) -> OutputInstructions | None:
    if output is None:
        return None
    return OutputInstructions(schema_from_example(output), name=f"{step_id}_output")


def _tools(spec: RecipeSpec, base: Path, problem: Any) -> list[Tool]:
    found: dict[str, Tool] = {}
    for index, reference in enumerate(spec.tools):
        try:
            for item in _import_tools(reference, base):
                found.setdefault(item.name, item)
        except MinionsError as exc:
            problem(str(exc), None, f"tools.{index}")
    http = spec.http if isinstance(spec.http, HttpSpec) else HttpSpec(enabled=spec.http)
    for builtin in builtin_tools(
        base / spec.workspace, http=http.enabled, allowed_hosts=http.allowed_hosts
    ):
        found.setdefault(builtin.name, builtin)
    return list(found.values())


def _import_tools(reference: str, base: Path) -> list[Tool]:
    """Tools from ``package.module:name`` or every tool of ``package.module``.

    A module beside the recipe file (``tools`` for ``tools.py``) is loaded from there under a
    name of its own, so two recipes' ``tools.py`` never clash.
    """
    module_name, _, attribute = reference.partition(":")
    module = _import_module(module_name, base)
    if attribute:
        value = getattr(module, attribute, None)
        if value is None:
            raise MinionsError(f"{module_name!r} has no {attribute!r}")
        if isinstance(value, Tool):
            return [value]
        if callable(value):
            return [Tool(value)]
        raise MinionsError(f"{reference!r} is not a function or tool")
    tools = [value for value in vars(module).values() if isinstance(value, Tool)]
    if not tools:
        raise MinionsError(f"module {module_name!r} defines no tools (functions with @tool)")
    return tools


def _import_module(name: str, base: Path) -> ModuleType:
    local = base.joinpath(*name.split(".")).with_suffix(".py")
    if local.is_file():
        digest = hashlib.sha1(str(local).encode()).hexdigest()[:8]
        unique = f"_minions_recipe_{digest}_{name.replace('.', '_')}"
        loaded = sys.modules.get(unique)
        if loaded is not None:
            return loaded
        spec = importlib.util.spec_from_file_location(unique, local)
        if spec is None or spec.loader is None:
            raise MinionsError(f"cannot load {str(local)!r}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[unique] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[unique]
            raise MinionsError(
                f"importing {str(local)!r} failed: {type(exc).__name__}: {exc}"
            ) from None
        return module
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise MinionsError(f"cannot import tools from {name!r}: {exc}") from None
    except Exception as exc:
        raise MinionsError(f"importing {name!r} failed: {type(exc).__name__}: {exc}") from None
