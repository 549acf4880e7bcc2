"""Structured output over the OpenAI chat protocol: the ladder of modes, and what each endpoint
supports.

Three modes (rungs), strongest first:

* ``json_schema``: native structured output, ``response_format={"type": "json_schema", ...}``;
* ``tool``: a call to an output tool whose parameters are the schema (forced with
  ``tool_choice`` when the step has no tools of its own);
* ``prompted_json``: the schema in the system prompt, the answer read from text (bare JSON,
  fenced, in prose, or trivially broken and repaired).

A rung the endpoint refuses (HTTP 400 naming the feature) is remembered per (base URL, model)
in the model's `CapabilityMemory`, and the next rung is tried at once; a rung the endpoint
accepts but ignores (prose instead of JSON) is re-asked, and demoted only when that happens
`CapabilityMemory.demote_after` (`IGNORED_BEFORE_DEMOTION`, 2) times in a row.

For pydantic models, instructor shapes the request of the ``json_schema`` and ``tool`` rungs,
through the public names of `instructor.v2`; a raw JSON Schema, or a model instructor cannot
shape (its API moved), is sent as its JSON Schema. minions makes the HTTP call, owns every
retry (so instructor's own retry loop never runs) and validates each answer once with
`OutputInstructions`, which is tolerant of JSON in prose and words the note the model is
re-asked with.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, get_args

from minions._log import warn
from minions._messages import OutputMode
from minions._output import extract_json
from minions.errors import OutputValidationError

if TYPE_CHECKING:
    from minions._messages import Message
    from minions._output import OutputInstructions

__all__ = ["CapabilityMemory", "OutputMode"]


"""A rung of the structured-output ladder."""

OUTPUT_MODES: Final[tuple[OutputMode, ...]] = get_args(OutputMode)
LADDER: Final[tuple[OutputMode, ...]] = ("json_schema", "tool", "prompted_json")
"""The ladder for a call without tools of its own."""
LADDER_WITH_TOOLS: Final[tuple[OutputMode, ...]] = ("tool", "prompted_json")
"""The ladder when the step also offers tools. Native ``response_format`` is left out: on
servers that enforce it with constrained decoding (vLLM, llama.cpp, Ollama) it forbids the
tool calls the step needs before its final answer."""

EndpointKey = tuple[str, str]
"""(base URL, model)."""


IGNORED_BEFORE_DEMOTION: Final = 2
"""How many answers in a row that ignore a mode (``json_schema`` answered with prose) demote
it, unless a `CapabilityMemory` says otherwise; one such answer is re-asked in the same mode."""


class CapabilityMemory:
    """What endpoints were found to refuse, and which structured-output mode last worked.

    Keyed by endpoint, a (base URL, model id) pair: the rungs of the ladder an endpoint refused
    (``json_schema``, ``tool``, ``prompted_json``), request options it refused
    (``stream_options``, and ``tools`` for one that ignores tools altogether), the mode that
    last produced valid output, and how many answers in a row ignored each mode.

    A feature is refused when the server answers HTTP 400 naming it (`reject`), or after
    `demote_after` answers in a row ignored it (`ignored`); a single unusable answer is only
    re-asked, and a valid answer in that mode (`record`) starts the count again.

    Each `OpenAIChatModel` has its own memory unless given one: pass the same memory to
    several models of one endpoint for them to learn together. Nothing is shared between
    models otherwise, nor kept past the memory's life, unless `on_change` keeps it: a
    worker's memory is kept in its run store that way, and `load` gives it back to every
    worker and later run. Safe to share between threads and event loops: writes take a
    lock, and each entry a read sees is replaced whole.

    Args:
        demote_after: how many answers in a row that ignore a mode demote it (at least 1;
            `IGNORED_BEFORE_DEMOTION`, 2, by default).

    Raises:
        ValueError: `demote_after` is below 1.
    """

    def __init__(self, *, demote_after: int = IGNORED_BEFORE_DEMOTION) -> None:
        if isinstance(demote_after, bool) or not isinstance(demote_after, int) or demote_after < 1:
            raise ValueError(
                f"demote_after must be a whole number of at least 1, not {demote_after!r}"
            )
        self.demote_after: Final = demote_after
        self._rejected: dict[EndpointKey, frozenset[str]] = {}
        self._worked: dict[EndpointKey, OutputMode] = {}
        self._ignored: dict[tuple[EndpointKey, OutputMode], int] = {}
        self._lock = threading.Lock()
        self.on_change: Callable[[EndpointKey], None] | None = None
        """Told the endpoint whose refusals or working mode just changed (`learned`)."""

    def _changed(self, key: EndpointKey) -> None:
        if self.on_change is not None:
            self.on_change(key)

    def learned(self, key: EndpointKey) -> tuple[frozenset[str], OutputMode | None]:
        """What is known of `key`: the features it refused, and the mode that last worked."""
        return self._rejected.get(key, frozenset()), self._worked.get(key)

    def load(self, known: Mapping[EndpointKey, tuple[frozenset[str], OutputMode | None]]) -> None:
        """Replace what was learned with `known` (a store's: endpoints it does not name are
        forgotten); the counts of ignored answers stay."""
        with self._lock:
            self._rejected = {key: rejected for key, (rejected, _) in known.items() if rejected}
            self._worked = {key: worked for key, (_, worked) in known.items() if worked}

    def rejected(self, key: EndpointKey) -> frozenset[str]:
        """The features `key` refused so far."""
        return self._rejected.get(key, frozenset())

    def reject(self, key: EndpointKey, feature: str) -> None:
        """Remember that `key` does not support `feature`."""
        if feature in self.rejected(key):
            return
        with self._lock:
            self._rejected[key] = self.rejected(key) | {feature}
        self._changed(key)

    def ignored(self, key: EndpointKey, mode: OutputMode) -> bool:
        """Count an answer of `key` that ignored `mode`; true when that demotes `mode` (the
        `demote_after`-th in a row), which is then refused."""
        with self._lock:
            count = self._ignored.get((key, mode), 0) + 1
            self._ignored[(key, mode)] = count
            if count < self.demote_after:
                return False
            self._rejected[key] = self._rejected.get(key, frozenset()) | {mode}
        self._changed(key)
        return True

    def ladder(self, key: EndpointKey, preferred: Sequence[OutputMode]) -> tuple[OutputMode, ...]:
        """The rungs of `preferred` that `key` has not refused; never empty (the last rung
        is always worth a try)."""
        rejected = self._rejected.get(key)
        if not rejected:
            return tuple(preferred)
        rungs = tuple(mode for mode in preferred if mode not in rejected)
        return rungs or (preferred[-1],)

    def record(self, key: EndpointKey, mode: OutputMode) -> None:
        """Remember that `mode` produced valid output for `key` (which also ends a run of
        answers that ignored it)."""
        if self._worked.get(key) != mode or (key, mode) in self._ignored:
            changed = self._worked.get(key) != mode
            with self._lock:
                self._worked[key] = mode
                self._ignored.pop((key, mode), None)
            if changed:
                self._changed(key)

    def worked(self, key: EndpointKey) -> OutputMode | None:
        """The mode that last produced valid output for `key`, if any did."""
        return self._worked.get(key)

    def forget(self, key: EndpointKey | None = None) -> None:
        """Forget what was learned about `key` (about every endpoint when `None`)."""
        with self._lock:
            if key is None:
                self._rejected.clear()
                self._worked.clear()
                self._ignored.clear()
            else:
                self._rejected.pop(key, None)
                self._worked.pop(key, None)
                for entry in [e for e in self._ignored if e[0] == key]:
                    del self._ignored[entry]


def check_modes(modes: Iterable[str]) -> tuple[OutputMode, ...]:
    """Validate a user's ladder.

    Raises:
        ValueError: a mode is unknown, or none is given.
    """
    result: list[OutputMode] = []
    for mode in modes:
        if mode not in OUTPUT_MODES:
            raise ValueError(
                f"unknown output mode {mode!r}; the modes are {', '.join(map(repr, OUTPUT_MODES))}"
            )
        result.append(mode)
    if not result:
        raise ValueError(f"output_modes is empty; give some of {', '.join(OUTPUT_MODES)}")
    return tuple(result)


# -- shaping requests ----------------------------------------------------------------------------


def _pydantic_model(output: OutputInstructions) -> type[Any] | None:
    """The output type when it is a pydantic model (what instructor handles), else `None`."""
    output_type = output.output_type
    if not isinstance(output_type, type):
        return None
    from pydantic import BaseModel

    return output_type if issubclass(output_type, BaseModel) else None


def _instructor_shape(output: OutputInstructions, mode: OutputMode) -> dict[str, Any] | None:
    """instructor's ``response_format`` (``json_schema``) or output tool (``tool``) for
    `output`, computed once per output type.

    `None` for a raw JSON Schema, and when instructor cannot shape the output type (its public
    `instructor.v2` API moved, or the type is beyond it): the request is then shaped from
    `OutputInstructions`, as for a raw JSON Schema. Answers are read without instructor either
    way.
    """
    cache_key = f"openai.instructor.{mode}"
    if cache_key in output._cache:
        cached: dict[str, Any] | None = output._cache[cache_key]
        return cached
    model = _pydantic_model(output)
    shape: dict[str, Any] | None = None
    if model is not None:
        try:
            shape = _ask_instructor(model, mode, output.tool_name)
        except Exception as exc:
            warn(
                "instructor could not shape the request; its JSON Schema is sent as it is",
                output_type=model.__name__,
                mode=mode,
                error=f"{type(exc).__name__}: {exc}",
            )
    output._cache[cache_key] = shape
    return shape


def _ask_instructor(model: type[Any], mode: OutputMode, name: str) -> dict[str, Any]:
    """instructor's shape of `model` for `mode`, named `name`, from `instructor.v2`'s public
    names (its request handler for OpenAI)."""
    from instructor.v2 import Mode, Provider, mode_registry

    instructor_mode = Mode.JSON_SCHEMA if mode == "json_schema" else Mode.TOOLS
    handlers = mode_registry.get_handlers(Provider.OPENAI, instructor_mode)
    _, kwargs = handlers.request_handler(model, {})
    if mode == "json_schema":
        fmt = kwargs["response_format"]
        return {**fmt, "json_schema": {**fmt["json_schema"], "name": name}}
    function = kwargs["tools"][0]["function"]
    return {"type": "function", "function": {**function, "name": name}}


def response_format(output: OutputInstructions) -> dict[str, Any]:
    """The native ``response_format`` for `output`."""
    return _instructor_shape(output, "json_schema") or {
        "type": "json_schema",
        "json_schema": {"name": output.tool_name, "schema": dict(output.json_schema())},
    }


def output_tool(output: OutputInstructions) -> dict[str, Any]:
    """The output tool for `output`, named `output.tool_name` (the name the step loop expects)."""
    return _instructor_shape(output, "tool") or {
        "type": "function",
        "function": {
            "name": output.tool_name,
            "description": "Give your final answer by calling this tool.",
            "parameters": dict(output.json_schema()),
        },
    }


def shape_request(
    request: Mapping[str, Any], output: OutputInstructions, mode: OutputMode, *, with_tools: bool
) -> dict[str, Any]:
    """`request` (OpenAI chat-completion keyword arguments) asking for `output` in `mode`."""
    shaped = dict(request)
    if mode == "json_schema":
        shaped["response_format"] = response_format(output)
        # Servers that enforce the schema with a grammar (llama.cpp, vLLM) never show it to the
        # model: what its fields mean would be lost without a line of them in the prompt.
        fields = output.field_descriptions()
        if fields:
            shaped["messages"] = _with_system_text(request["messages"], fields)
    elif mode == "tool":
        tool = output_tool(output)
        shaped["tools"] = [*request.get("tools", ()), tool]
        # "required": with tools of its own the model must still be free to call them first,
        # and it keeps it from ending the step in prose instead of through the output tool;
        # without, the output tool is the only one, so "required" forces it as a named choice
        # would, and servers that ignore a named choice (llama.cpp) honour "required".
        shaped["tool_choice"] = "required"
    else:
        text = output.render_instructions(with_tools=with_tools)
        shaped["messages"] = _with_system_text(request["messages"], text)
    return shaped


def _with_system_text(messages: Sequence[Mapping[str, Any]], text: str) -> list[Any]:
    # Chat templates of many local models accept a system message only in first place, so
    # the text joins the existing system prompt instead of adding another one.
    result = list(messages)
    if result and result[0].get("role") == "system":
        result[0] = {**result[0], "content": f"{result[0]['content']}\n\n{text}"}
    else:
        result.insert(0, {"role": "system", "content": text})
    return result


# -- reading answers -----------------------------------------------------------------------------


class ModeIgnoredError(OutputValidationError):
    """The endpoint accepted a mode but the answer ignored it: ``json_schema`` answered without
    JSON, or a forced output tool answered without calling any tool."""


NO_OUTPUT: Final = object()
"""`read_output`'s answer for a reply that calls the step's own tools (no output yet)."""


def read_output(
    message: Message, output: OutputInstructions, mode: OutputMode
) -> tuple[Any, OutputMode]:
    """The validated output in `message` (`NO_OUTPUT` when the model called other tools), and
    the mode that produced it: `mode`, except for JSON read from the text of an answer to the
    ``tool`` rung, which is ``prompted_json``.

    Raises:
        OutputValidationError: the answer is not valid output; its message is the note to
            re-ask with. `ModeIgnoredError` when the endpoint evidently ignored `mode`.
    """
    name = output.tool_name
    calls = message.tool_calls
    if mode == "tool":
        mine = [call for call in calls if call.name == name]
        if mine:
            # `message_of` parsed the arguments already: validated here, once.
            return output.validate_python(dict(mine[0].arguments)), mode
    if calls:
        return NO_OUTPUT, mode
    try:
        value = output.validate_json(message.content)
    except OutputValidationError as exc:
        if _has_json(message.content):
            raise
        if mode == "json_schema":
            raise ModeIgnoredError(
                "Your answer did not contain a JSON object. " + output.render_instructions()
            ) from None
        if mode == "tool":
            # The tool was forced ("required"): an answer calling nothing ignored it, as servers
            # that drop `tools` do (llama.cpp with a template without tool support).
            raise ModeIgnoredError(
                f"You did not call the tool {name!r}. Give your final answer by calling it."
            ) from None
        raise exc from None
    return value, "prompted_json" if mode == "tool" else mode


def _has_json(text: str) -> bool:
    try:
        extract_json(text)
    except OutputValidationError:
        return False
    return True
