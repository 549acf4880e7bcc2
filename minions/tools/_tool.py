"""Tools: typed Python functions a model may call.

`@tool` turns a sync or async function into a `Tool`. Its JSON Schema comes from the type hints
and the docstring (Google, NumPy or reST style); its arguments are validated with pydantic
before it runs. A `Tool` is still callable like the function it wraps.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any, get_origin, overload

from minions._messages import ToolSpec
from minions.errors import ToolDefinitionError, ToolError
from minions.tools._context import ToolContext

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = ["Tool", "ToolRegistry", "tool"]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_CONTEXT = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?ToolContext(?:\[.*\])?$")


def _is_context(annotation: object) -> bool:
    """Whether a parameter's annotation is `ToolContext` (``ToolContext[Deps]``, or the same
    as a string, as ``from __future__ import annotations`` leaves it)."""
    if isinstance(annotation, str):
        return _CONTEXT.match(annotation.strip().strip("'\"")) is not None
    return annotation is ToolContext or get_origin(annotation) is ToolContext


class Tool:
    """A function a model may call, with its name, description and JSON Schema.

    Args:
        fn: the function, sync or async. Parameters need type hints (unannotated ones accept
            anything); `*args` and `**kwargs` are not allowed. A first parameter annotated
            ``ToolContext[D]`` receives the call's `ToolContext` (run, step, call id,
            idempotency key, attempt, and ``ctx.deps``: the run's deps, typed ``D``); it is
            not part of the JSON Schema the model sees.
        name: defaults to the function's name.
        description: defaults to the docstring's summary.
        run_in_thread: run a sync function in a worker thread (the default, so a blocking
            tool never stalls other steps); set False for quick, CPU-only functions.
        requires_approval: a person approves each call first (the run asks its approver;
            see `minions.tools.Approver`); a rejected call is not made.
        side_effects: calling it changes something outside the run (the default, as a tool
            cannot tell); ``False`` for a tool that only reads, so that a step using it may be
            served from the step cache (see `Step`'s ``cache``).
    """

    origin: tuple[str, str] | None = None
    """``(server, tool)`` for a tool of an MCP server (steps ask for it as ``server.tool``);
    ``None`` for a Python function."""
    takes_context: bool = False
    """Its first parameter is a `ToolContext`: each call passes the call's context."""
    reach: str | None = None
    """What the tool reaches besides its arguments, when that is not the same for every
    instance of its function (a file tool's folder): part of the step cache's key, so a
    step never answers from an entry made where the tool saw other things."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        run_in_thread: bool = True,
        requires_approval: bool = False,
        side_effects: bool = True,
    ) -> None:
        self.fn = fn
        self.requires_approval = requires_approval
        self.side_effects = side_effects
        self.name: str = name or str(getattr(fn, "__name__", ""))
        if not _NAME.match(self.name):
            raise ToolDefinitionError(
                f"tool name {self.name!r} must be 1-64 letters, digits, '_' or '-'"
            )
        self.is_async = inspect.iscoroutinefunction(fn)
        self.run_in_thread = run_in_thread and not self.is_async
        self._signature = inspect.signature(fn)
        params = list(self._signature.parameters.values())
        self.takes_context = bool(params) and _is_context(params[0].annotation)
        for index, param in enumerate(params):
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ToolDefinitionError(
                    f"tool {self.name!r}: *args and **kwargs cannot be described to a model; "
                    f"give parameter {param.name!r} a name and a type"
                )
            if index > 0 and _is_context(param.annotation):
                raise ToolDefinitionError(
                    f"tool {self.name!r}: its ToolContext parameter {param.name!r} must be "
                    "the first one"
                )
        self._description = description

    @cached_property
    def _doc(self) -> Any:
        import docstring_parser

        return docstring_parser.parse(inspect.getdoc(self.fn) or "")

    @property
    def description(self) -> str:
        """What the model is told the tool does: the given description, else the docstring's
        summary and body."""
        if self._description is not None:
            return self._description
        doc = self._doc
        parts = [doc.short_description or "", doc.long_description or ""]
        return "\n\n".join(p for p in parts if p)

    @cached_property
    def _arguments_model(self) -> type[BaseModel]:
        from pydantic import ConfigDict, Field, create_model

        try:
            hints = inspect.get_annotations(self.fn, eval_str=True)
        except Exception as exc:
            raise ToolDefinitionError(
                f"tool {self.name!r}: cannot read its type hints ({exc})"
            ) from None
        described = {p.arg_name: p.description for p in self._doc.params}
        fields: dict[str, Any] = {}
        params = list(self._signature.parameters.items())
        for pname, param in params[1:] if self.takes_context else params:
            annotation = hints.get(pname, Any)
            default = ... if param.default is param.empty else param.default
            fields[pname] = (annotation, Field(default, description=described.get(pname)))
        try:
            return create_model(
                f"{self.name}_arguments",
                __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=False),
                **fields,
            )
        except Exception as exc:
            raise ToolDefinitionError(f"tool {self.name!r}: invalid parameters: {exc}") from None

    @cached_property
    def parameters(self) -> Mapping[str, Any]:
        """The JSON Schema of the tool's arguments."""
        schema = _strip_titles(self._arguments_model.model_json_schema())
        schema.setdefault("properties", {})
        return schema

    @property
    def spec(self) -> ToolSpec:
        """The tool as a model is told about it: name, description and parameters' JSON Schema."""
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)

    def problems(self) -> list[str]:
        """What is wrong with this tool's definition (empty when it is usable)."""
        return list(self._problems)

    @cached_property
    def _problems(self) -> tuple[str, ...]:
        problems = []
        try:
            self.parameters  # noqa: B018 - building the schema is the check.
        except Exception as exc:
            problems.append(str(exc))
        returns = self._signature.return_annotation
        if returns is not inspect.Signature.empty:
            try:
                hints = inspect.get_annotations(self.fn, eval_str=True)
                from pydantic import TypeAdapter

                TypeAdapter(hints.get("return", Any)).json_schema(mode="serialization")
            except Exception:
                problems.append(
                    f"tool {self.name!r} returns {returns!r}, which cannot be serialized to "
                    f"JSON for the model; return a str, number, bool, list, dict, dataclass or "
                    f"pydantic model"
                )
        return tuple(problems)

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Check arguments against the schema and convert them to the parameters' types.

        Raises:
            ToolError: naming each invalid argument, for the model to correct.
        """
        from pydantic import ValidationError

        model = self._arguments_model
        try:
            validated = model.model_validate(arguments)
        except ValidationError as exc:
            problems = []
            for err in exc.errors(include_url=False):
                where = ".".join(str(p) for p in err["loc"]) or "arguments"
                problems.append(f"{where}: {err['msg']}")
            expected = ", ".join(
                f"{name}: {prop.get('type', 'any')}"
                for name, prop in self.parameters.get("properties", {}).items()
            )
            raise ToolError(
                f"Invalid arguments for tool {self.name!r}: {'; '.join(problems)}. "
                f"Expected ({expected})."
            ) from None
        return {name: getattr(validated, name) for name in model.model_fields}

    def argument_problem(self, name: str, value: Any) -> str | None:
        """What is wrong with `value` as the argument `name` (an unknown name, or a value of
        the wrong type), or ``None`` when it is fine. Checks one argument alone, so a call's
        other arguments may still be unknown (a recipe's templated parameters)."""
        from pydantic import TypeAdapter, ValidationError

        fields = self._arguments_model.model_fields
        if name not in fields:
            from minions.errors import did_you_mean

            known = ", ".join(fields) or "none"
            return (
                f"tool {self.name!r} has no parameter {name!r}{did_you_mean(name, fields)}; "
                f"its parameters: {known}"
            )
        try:
            TypeAdapter(fields[name].annotation or Any).validate_python(value)
        except ValidationError as exc:
            reason = "; ".join(err["msg"] for err in exc.errors(include_url=False))
            return f"parameter {name!r} of tool {self.name!r}: {reason} (got {value!r})"
        return None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"


# Keywords whose values are data, not schemas: a "title" key in them is the user's.
_DATA_KEYWORDS = frozenset({"default", "enum", "const", "examples"})


def _strip_titles(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Drop the titles pydantic generates: they repeat the names and cost small models tokens."""
    result: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in _DATA_KEYWORDS:
            result[key] = value
        elif key in ("properties", "$defs", "definitions") and isinstance(value, Mapping):
            result[key] = {
                k: _strip_titles(v) if isinstance(v, Mapping) else v for k, v in value.items()
            }
        elif isinstance(value, Mapping):
            result[key] = _strip_titles(value)
        elif isinstance(value, list):
            result[key] = [_strip_titles(v) if isinstance(v, Mapping) else v for v in value]
        else:
            result[key] = value
    return result


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    run_in_thread: bool = True,
    requires_approval: bool = False,
    side_effects: bool = True,
) -> Callable[[Callable[..., Any]], Tool]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    run_in_thread: bool = True,
    requires_approval: bool = False,
    side_effects: bool = True,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a `Tool` from a function; use as `@tool` or `@tool(name=..., ...)`."""

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(
            f,
            name=name,
            description=description,
            run_in_thread=run_in_thread,
            requires_approval=requires_approval,
            side_effects=side_effects,
        )

    return wrap(fn) if fn is not None else wrap


class ToolRegistry:
    """The tools known to a run, by name."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for item in tools:
            self.register(item)

    def register(self, item: Tool | Callable[..., Any]) -> Tool:
        """Add a tool (a plain function is wrapped with `tool`)."""
        added = item if isinstance(item, Tool) else Tool(item)
        existing = self._tools.get(added.name)
        if existing is not None and existing is not added:
            raise ToolDefinitionError(f"two different tools are named {added.name!r}")
        self._tools[added.name] = added
        return added

    def get(self, name: str) -> Tool | None:
        """The tool named `name`, or the MCP tool `name` refers to (``server.tool``)."""
        found = self._tools.get(name)
        if found is None and "." in name:
            server, _, remote = name.partition(".")
            found = next((t for t in self._tools.values() if t.origin == (server, remote)), None)
        return found

    def require(self, name: str) -> Tool:
        """The tool named `name`.

        Raises:
            ToolError: there is none (the message lists the tools there are, for the model).
        """
        found = self.get(name)
        if found is None:
            raise ToolError(f"Unknown tool {name!r}. Available tools: {self._available()}.")
        return found

    def _available(self) -> str:
        return ", ".join(sorted(self._tools)) or "none"

    @property
    def names(self) -> list[str]:
        """The registered tools' names, sorted."""
        return sorted(self._tools)

    def subset(self, names: Iterable[str]) -> ToolRegistry:
        """A registry of only the named tools (unknown names are ignored). A name may be an MCP
        reference: ``server.tool`` for one tool of an MCP server, ``server.*`` for all of
        them."""
        wanted = set(names)
        if not wanted:
            return ToolRegistry()  # a step without tools: the common case, on every step
        references = {(s, t) for s, _, t in (n.partition(".") for n in wanted if "." in n)}
        subset = ToolRegistry()
        subset._tools = {
            name: tool
            for name, tool in sorted(self._tools.items())
            if name in wanted
            or (
                tool.origin is not None
                and (
                    (tool.origin[0], tool.origin[1]) in references
                    or (tool.origin[0], "*") in references
                )
            )
        }
        return subset

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"ToolRegistry({self.names})"
