"""From a checked `RecipeSpec` to an `AgentRecipe`, and back to YAML."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.machinery
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minions._imports import import_module
from minions._kinds.analysis import AnalysisStep
from minions._kinds.example import schema_from_example
from minions._kinds.loop import LoopStep
from minions._kinds.task import TaskStep
from minions._kinds.tool import ToolStep
from minions._messages import MessageBundle
from minions._output import OutputInstructions
from minions._routing.transition import Transition
from minions._step.agent import DefaultStep
from minions._step.step import Step, recipe_id_problem
from minions._yaml import Located, collector_paused
from minions.errors import MinionsError, Problem, RecipeError
from minions.models import FallbackModel, Model
from minions.recipes._loader import by_line, check_spec, read_recipe_text, step_label
from minions.recipes._recipe import AgentRecipe
from minions.recipes._schema import HttpSpec, RecipeSpec, StepSpec
from minions.recipes._subrecipe import RecipeStep
from minions.recipes._validation import recipe_problems
from minions.tools import Tool, ToolRegistry, builtin_tools

__all__ = ["RecipeFile", "load_recipe", "load_recipe_file", "parse_recipe"]


@dataclass(frozen=True, kw_only=True)
class RecipeFile:
    """A recipe loaded from YAML: the `AgentRecipe`, its spec, and where it came from."""

    recipe: AgentRecipe
    spec: RecipeSpec
    path: Path | None
    located: Located


@dataclass(frozen=True, kw_only=True)
class _Load:
    """What one load shares with the recipes it includes."""

    stack: tuple[Path, ...] = ()
    import_tools: bool = True
    workspace: Path | None = None
    """The file tools' folder, when the caller chose it: it overrides every recipe's."""
    inherited: Path | None = None
    """The including recipe's workspace, for an included recipe that names none."""
    protected: set[Path] = dataclasses.field(default_factory=set)
    """The files the load read: recipes and tool modules, which file tools never write."""

    def enter(self, file: Path) -> _Load:
        return dataclasses.replace(self, stack=(*self.stack, file))


def default_workspace(recipe_id: str) -> Path:
    """Where a recipe's file tools work unless it says otherwise: a folder of its own,
    ``.minions/workspace/<recipe id>`` in the current directory (created by the first write).

    Raises:
        RecipeError: the folder would not be inside ``.minions/workspace``: the id is not
            one folder name, or a link planted under that name leads elsewhere.
    """
    root = (Path.cwd() / ".minions" / "workspace").resolve()
    folder = root / recipe_id
    # A slug is one folder name; checked again here, resolved, because this path is where
    # the run's file tools will write.
    if recipe_id_problem(recipe_id) is not None or folder.resolve().parent != root:
        message = (
            f"the workspace of recipe {recipe_id[:80]!r} would not be a folder of "
            ".minions/workspace (is .minions/workspace/<id> a link?); give the recipe a "
            "`workspace:`, or run it with --workspace"
        )
        raise RecipeError([Problem(message=message, field="workspace")])
    return folder


def load_recipe_file(
    path: str | Path,
    *,
    import_tools: bool = True,
    workspace: str | Path | None = None,
    text: str | None = None,
    parsed: tuple[RecipeSpec, Located] | None = None,
    _load: _Load | None = None,
) -> RecipeFile:
    """Load, check and build a YAML recipe file.

    `text` is the file's content when the caller has it already (a durable run's snapshot):
    the file is then not read, but tools and included recipes are still found beside it.
    `parsed` is `text` checked against the recipe format already (`parse_spec`): it is not
    parsed again.

    `workspace` is the folder of the file tools (``read_file``, ``write_file``,
    ``list_files``), overriding the recipe's ``workspace:``; by default a recipe that names
    none works in `default_workspace`. With ``import_tools=False`` no code of the recipe runs:
    each module in ``tools:`` is only checked to exist, and the steps' tool names and
    parameters are not checked against it (for a recipe you do not trust; see
    docs/recipes.md, "Recipes are code").

    Raises:
        RecipeError: every problem found, each with file, line, step and field.
    """
    load = _load or _Load(
        import_tools=import_tools,
        workspace=Path(workspace).resolve() if workspace is not None else None,
    )
    file = Path(path).resolve()
    if file in load.stack:
        chain = " -> ".join(p.name for p in (*load.stack, file))
        raise RecipeError([Problem(message=f"recipes include each other: {chain}", file=str(path))])
    if text is None:
        text = read_recipe_text(path)
    load.protected.add(file)
    return _built(
        text,
        str(path),
        lambda spec, located: build_recipe(
            spec, located, base=file.parent, path=file, _load=load.enter(file)
        ),
        parsed,
    )


def _built(
    text: str,
    file: str,
    build: Callable[[RecipeSpec, Located], RecipeFile],
    parsed: tuple[RecipeSpec, Located] | None = None,
) -> RecipeFile:
    """`build` the recipe of YAML `text` (`parsed` already: a spec without problems), or
    raise every problem of it in one pass, by line: those of the format, and those `build`
    finds in the rest of the recipe."""
    if parsed is not None:
        return build(parsed[0], dataclasses.replace(parsed[1], file=file))
    with collector_paused(text):
        spec, located, problems = check_spec(text, file=file)
        if spec is not None and not problems:
            return build(spec, located)
        if spec is not None:
            try:
                build(spec, located)
            except RecipeError as exc:
                problems += exc.problems
    raise RecipeError(by_line(dict.fromkeys(problems)))  # each once


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
    folder = Path(base).resolve()
    return _built(text, "", lambda spec, located: build_recipe(spec, located, base=folder)).recipe


def build_recipe(
    spec: RecipeSpec,
    located: Located,
    *,
    base: Path,
    path: Path | None = None,
    _load: _Load | None = None,
) -> RecipeFile:
    """Build the `AgentRecipe` a spec describes, and check it whole."""
    load = _load or _Load()
    if load.workspace is not None:
        workspace = load.workspace
    elif spec.workspace is not None:
        workspace = (base / spec.workspace).resolve()
    elif load.inherited is not None:
        workspace = load.inherited
    else:
        try:
            workspace = default_workspace(spec.id)
        except RecipeError as exc:
            line = located.line(("id",))
            raise RecipeError(
                [dataclasses.replace(p, file=located.file, line=line) for p in exc.problems]
            ) from None
    load = dataclasses.replace(load, inherited=workspace)
    problems: list[Problem] = []

    def problem(message: str, index: int | None = None, field: str | None = None) -> None:
        step = step_label(located, index) if index is not None else None
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

    tools = _tools(spec, base, problem, load, workspace)
    mcp_servers = _mcp_servers(spec, base, problem)
    steps: list[Step] = []
    transitions = []
    aliases: dict[str, str] = {}
    for index, step_spec in enumerate(spec.steps):
        try:
            steps.append(_step(step_spec, base, load))
        except RecipeError as exc:
            for p in exc.problems:
                problem(f"in {p.file}: {p}" if p.file else p.message, index, "recipe")
            steps.append(_stand_in(step_spec))
        except MinionsError as exc:
            for message in getattr(exc, "problems", [str(exc)]):
                problem(message.removeprefix(f"step {step_spec.id!r}: "), index)
            steps.append(_stand_in(step_spec))
        for target in step_spec.next:
            transitions.append(Transition(step_spec.id, target.step, when=target.when))
        if step_spec.save_as is not None:
            if step_spec.save_as in aliases:
                problem(f"save_as {step_spec.save_as!r} is used twice", index, "save_as")
            aliases[step_spec.save_as] = step_spec.id
    config = dict(spec.config)
    defaults = {name: i.default for name, i in spec.inputs.items() if i.default is not None}
    recipe = AgentRecipe(
        id=spec.id,
        description=spec.description,
        steps=steps,
        transitions=transitions,
        model=model_of(spec.model),
        config=config,
        inputs=defaults,
        tools=tools,
        aliases=aliases,
        input_specs=spec.inputs,
        execution_mode=spec.execution_mode,
        mcp_servers=mcp_servers,
    )
    # Without the imports, a step's tool may come from a module nobody looked into.
    registry = ToolRegistry(tools) if load.import_tools or not spec.tools else None
    for issue in recipe_problems(recipe, registry, mcp_servers=list(spec.mcp_servers)):
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


def model_of(spec: str | list[str] | None) -> Model | str | None:
    """The model a recipe's ``model:`` names: a string as it is, a list as a `FallbackModel`
    of its strings (resolved when a run uses them, like any model string)."""
    if isinstance(spec, list):
        return FallbackModel(*spec)
    return spec


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


def _cache(spec: StepSpec) -> dict[str, Any]:
    return {"cache": spec.cache if isinstance(spec.cache, bool) else spec.cache.model_dump()}


def _body(spec: StepSpec, base: Path, load: _Load, options: dict[str, Any]) -> Step:
    own: dict[str, Any] = {"model": model_of(spec.model), "config": spec.config or None, **options}
    output = spec.output if spec.output is not None else spec.output_format
    if spec.kind == "agent" and spec.type is not None:
        assert spec.goal is not None
        return TaskStep(
            spec.id,
            spec.goal,
            type=spec.type,
            reads=spec.reads,
            artifacts=spec.artifacts,
            tools=spec.tools,
            **own,
        )
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
        return ToolStep(
            spec.id,
            spec.tool,
            spec.params,
            fill_missing=spec.fill_missing,
            requires_approval=spec.requires_approval,
            **own,
        )
    assert spec.recipe is not None
    child = load_recipe_file(base / spec.recipe, _load=load)
    return RecipeStep(spec.id, child.recipe, inputs=spec.inputs, **own)


def _step(spec: StepSpec, base: Path, load: _Load) -> Step:
    if spec.loop is None:
        return _body(spec, base, load, {**_options(spec), **_cache(spec)})
    # The loop carries the scheduling options; the body runs once per item (each item is
    # cached on its own).
    body = _body(spec, base, load, {"description": spec.description, **_cache(spec)})
    return LoopStep(
        body,
        spec.loop.items,
        parallel=spec.parallel or spec.loop.parallel,
        continue_on_error=spec.loop.continue_on_error,
        **_options(spec),
    )


def _stand_in(spec: StepSpec) -> Step:
    """What the recipe's checks see of a step that could not be built (its problems are
    said): its id and dependencies, so that the other steps are checked in the same pass."""
    return DefaultStep(
        spec.id, MessageBundle(goal="(a step that could not be built)"), depends_on=spec.depends_on
    )


def _instructions(step_id: str, output: Any) -> OutputInstructions | None:
    if output is None:
        return None
    return OutputInstructions(schema_from_example(output), name=f"{step_id}_output")


def _tools(spec: RecipeSpec, base: Path, problem: Any, load: _Load, workspace: Path) -> list[Tool]:
    found: dict[str, Tool] = {}
    for index, reference in enumerate(spec.tools):
        try:
            if not load.import_tools:
                _locate_tools(reference, base)
                continue
            for item in import_tools(reference, base, load.protected):
                found.setdefault(item.name, item)
        except MinionsError as exc:
            problem(str(exc), None, f"tools.{index}")
    http = spec.http if isinstance(spec.http, HttpSpec) else HttpSpec(enabled=spec.http)
    for builtin in builtin_tools(
        workspace,
        http=http.enabled,
        allowed_hosts=http.allowed_hosts,
        protected=load.protected,
    ):
        found.setdefault(builtin.name, builtin)
    return list(found.values())


def _mcp_servers(spec: RecipeSpec, base: Path, problem: Any) -> dict[str, Any]:
    """The recipe's MCP servers, ``${VAR}`` expanded (a variable that is not set is a problem
    on its line); a stdio server works in the recipe's folder unless it says otherwise."""
    from minions.tools._internal import server_config

    servers: dict[str, Any] = {}
    for name, value in spec.mcp_servers.items():
        found: list[Problem] = []
        config = server_config(name, value, found, base=base)
        for issue in found:
            problem(issue.message, None, issue.field)
        if config is not None:
            servers[name] = config
    return servers


def import_tools(reference: str, base: Path, protected: set[Path]) -> list[Tool]:
    """Tools from ``package.module:name`` or every tool of ``package.module`` (a recipe's
    ``tools:``, `minions plan --tools`); the module's file joins `protected`.

    A module beside the recipe file (``tools`` for ``tools.py``) is loaded from there under a
    name of its own, so two recipes' ``tools.py`` never clash.

    Raises:
        MinionsError: the module cannot be imported, or has no such tool (or none).
    """
    module_name, _, attribute = reference.partition(":")
    module = import_module(module_name, base)
    if module.__file__ is not None:
        protected.add(Path(module.__file__).resolve())
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


def _locate_tools(reference: str, base: Path) -> None:
    """Check that ``module[:name]`` can be found, without running any of its code."""
    module_name, _, attribute = reference.partition(":")
    local = base.joinpath(*module_name.split(".")).with_suffix(".py")
    if local.is_file():
        source: Path | None = local
    else:
        source = _find_module(module_name)
    if not attribute or source is None or source.suffix != ".py":
        return
    try:
        tree = ast.parse(source.read_bytes(), filename=str(source))
    except (SyntaxError, ValueError) as exc:
        raise MinionsError(f"{str(source)!r} is not valid Python: {exc}") from None
    names = _top_level_names(tree)
    # A star import or a module __getattr__ may define any name: only an import would tell.
    if attribute not in names and "*" not in names and "__getattr__" not in names:
        raise MinionsError(f"{module_name!r} has no {attribute!r}")


def _find_module(name: str) -> Path | None:
    """Where module `name` lives, found the way `import` would, without importing anything
    (not even its parent packages). None for a module without a file (built into Python)."""
    if name in sys.builtin_module_names:
        return None
    search: list[str] | None = None
    spec = None
    for depth, part in enumerate(name.split(".")):
        spec = importlib.machinery.PathFinder.find_spec(part, search)
        if spec is None:
            missing = ".".join(name.split(".")[: depth + 1])
            raise MinionsError(f"cannot find module {missing!r} (tools from {name!r})")
        search = list(spec.submodule_search_locations or [])
    if spec is None or spec.origin is None or not spec.has_location:
        return None
    return Path(spec.origin)


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)  # "*" too
        else:
            # Names bound under `if`/`try` at the top level count too.
            for inner in ast.walk(node):
                if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    names.add(inner.name)
                elif isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Store):
                    names.add(inner.id)
    return names
