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
`CapabilityMemory.demote_after` (`IGNORED_BEFORE_DEMOTION`, 2) times in a row. Within a run
(`LEARNING_RUN`), such a demotion is the run's own until `CapabilityMemory.demote_runs`
distinct runs saw it: one run's prompt that makes a model answer prose does not demote the
mode for the others.

For pydantic models, instructor shapes the request of the ``json_schema`` and ``tool`` rungs,
through the public names of `instructor.v2`; a raw JSON Schema, or a model instructor cannot
shape (its API moved), is sent as its JSON Schema. minions makes the HTTP call, owns every
retry (so instructor's own retry loop never runs) and validates each answer once with
`OutputInstructions`, which is tolerant of JSON in prose and words the note the model is
re-asked with.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, get_args

from minions._log import warn
from minions._messages import OutputMode
from minions._output import extract_json
from minions.errors import OutputValidationError
from minions.models._learning import LEARNING_RUN

if TYPE_CHECKING:
    from minions._messages import Message
    from minions._output import OutputInstructions

__all__ = ["CapabilityMemory", "Evidence", "OutputMode"]


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

_RUNS_KEPT: Final = 1024
"""The runs whose own demotions a memory keeps (the oldest are forgotten first)."""

Cause = Literal["refused", "ignored"]


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """Why an endpoint's feature is refused: what `CapabilityMemory.evidence` says of each
    refused feature (and `EndpointRecord.evidence` of a run store's endpoints); given to
    `CapabilityMemory.demote` and `CapabilityMemory.load`.

    Attributes:
        cause: ``"refused"``: the server refused it on the wire (an HTTP 400 naming it);
            ``"ignored"``: answers ignored it (`CapabilityMemory.demote_after` in a row), in
            as many distinct runs as `CapabilityMemory.demote_runs` asks.
        since: when it was first seen, in Unix seconds (the first of the runs' strikes).
        runs: the ids of the runs whose answers ignored it, oldest first (``"ignored"``;
            empty for calls made outside a run).
        detail: what the server said (``"refused"``).
    """

    cause: Cause
    since: float
    runs: tuple[str, ...] = ()
    detail: str = ""


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

    Answers that ignore a mode within a run (`LEARNING_RUN` set by the step loop) demote it
    for that run at once, and for every run once `demote_runs` distinct runs did so (each
    run a strike); a refusal on the wire is every run's at once. What each refusal rests on
    is kept (`evidence`).

    Args:
        demote_after: how many answers in a row that ignore a mode demote it (at least 1;
            `IGNORED_BEFORE_DEMOTION`, 2, by default).
        demote_runs: how many distinct runs must each have had a mode demoted that way
            before it is demoted for every run (at least 1; 1 by default: a model's own
            memory learns from its own calls).
        clock: the time in seconds of the evidence (`time.time`).

    Raises:
        ValueError: `demote_after` or `demote_runs` is below 1.
    """

    def __init__(
        self,
        *,
        demote_after: int = IGNORED_BEFORE_DEMOTION,
        demote_runs: int = 1,
        clock: Callable[[], float] = time.time,
    ) -> None:
        for name, value in (("demote_after", demote_after), ("demote_runs", demote_runs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number of at least 1, not {value!r}")
        self.demote_after: Final = demote_after
        self.demote_runs: Final = demote_runs
        self.clock = clock
        self._rejected: dict[EndpointKey, frozenset[str]] = {}
        self._evidence: dict[EndpointKey, dict[str, Evidence]] = {}
        self._worked: dict[EndpointKey, OutputMode] = {}
        self._ignored: dict[tuple[EndpointKey, OutputMode, str | None], int] = {}
        self._strikes: dict[tuple[EndpointKey, OutputMode], dict[str, float]] = {}
        self._own: OrderedDict[tuple[str, EndpointKey], frozenset[str]] = OrderedDict()
        """Features demoted for one run only (its answers ignored them)."""
        self._lock = threading.Lock()
        self.on_change: Callable[[EndpointKey], None] | None = None
        """Told the endpoint whose refusals or working mode just changed (`learned`)."""
        self.on_strike: Callable[[EndpointKey, OutputMode, str], None] | None = None
        """Told a run whose answers demoted a mode for itself (a store counts the runs of
        every worker, and calls `demote` when enough agree)."""

    def _changed(self, key: EndpointKey) -> None:
        if self.on_change is not None:
            self.on_change(key)

    def learned(self, key: EndpointKey) -> tuple[frozenset[str], OutputMode | None]:
        """What is known of `key`: the features it refused, and the mode that last worked."""
        return self._rejected.get(key, frozenset()), self._worked.get(key)

    def evidence(self, key: EndpointKey) -> dict[str, Evidence]:
        """Why each feature `key` refused is refused (features learned without evidence, by
        a store of before, have none)."""
        return dict(self._evidence.get(key, {}))

    def load(
        self,
        known: Mapping[EndpointKey, tuple[frozenset[str], OutputMode | None]],
        evidence: Mapping[EndpointKey, Mapping[str, Evidence]] | None = None,
    ) -> None:
        """Replace what was learned with `known` (a store's: endpoints it does not name are
        forgotten) and its `evidence`; the counts of ignored answers and each run's own
        demotions stay."""
        with self._lock:
            self._rejected = {key: rejected for key, (rejected, _) in known.items() if rejected}
            self._worked = {key: worked for key, (_, worked) in known.items() if worked}
            self._evidence = {
                key: {f: e for f, e in (evidence or {}).get(key, {}).items() if f in rejected}
                for key, rejected in self._rejected.items()
            }

    def rejected(self, key: EndpointKey) -> frozenset[str]:
        """The features `key` refused so far (for every run)."""
        return self._rejected.get(key, frozenset())

    def reject(self, key: EndpointKey, feature: str, *, detail: str = "") -> None:
        """Remember that `key` does not support `feature`: the server refused it (`detail`:
        what it said)."""
        self.demote(key, feature, Evidence(cause="refused", since=self.clock(), detail=detail))

    def demote(self, key: EndpointKey, feature: str, evidence: Evidence) -> None:
        """Refuse `feature` of `key` for every run, on `evidence`."""
        if feature in self.rejected(key):
            return
        with self._lock:
            self._rejected[key] = self.rejected(key) | {feature}
            self._evidence.setdefault(key, {})[feature] = evidence
        self._changed(key)

    def ignored(self, key: EndpointKey, mode: OutputMode, *, also: Iterable[str] = ()) -> bool:
        """Count an answer of `key` that ignored `mode`; true when that demotes `mode` (the
        `demote_after`-th in a row), with the features `also`: for this run only (its
        `LEARNING_RUN`) until `demote_runs` distinct runs did so, then for every run."""
        run = LEARNING_RUN.get()
        features = frozenset({mode, *also})
        with self._lock:
            count = self._ignored.get((key, mode, run), 0) + 1
            self._ignored[(key, mode, run)] = count
            if count < self.demote_after:
                return False
            if run is not None:
                own = (run, key)
                self._own[own] = self._own.get(own, frozenset()) | features
                self._own.move_to_end(own)
                while len(self._own) > _RUNS_KEPT:
                    self._own.popitem(last=False)
                strikes = self._strikes.setdefault((key, mode), {})
                strikes.setdefault(run, self.clock())
                runs = tuple(strikes)
            else:
                runs = ()
        if run is not None and self.on_strike is not None:
            self.on_strike(key, mode, run)
        if run is None or len(runs) >= self.demote_runs:
            since = self.clock() if run is None else min(self._strikes[(key, mode)].values())
            evidence = Evidence(cause="ignored", since=since, runs=runs)
            for feature in sorted(features):
                self.demote(key, feature, evidence)
        return True

    def ladder(self, key: EndpointKey, preferred: Sequence[OutputMode]) -> tuple[OutputMode, ...]:
        """The rungs of `preferred` that `key` has not refused (for every run, or for the
        run learning now); never empty (the last rung is always worth a try)."""
        rejected = self._rejected.get(key, frozenset())
        run = LEARNING_RUN.get()
        if run is not None and self._own:
            rejected = rejected | self._own.get((run, key), frozenset())
        if not rejected:
            return tuple(preferred)
        rungs = tuple(mode for mode in preferred if mode not in rejected)
        return rungs or (preferred[-1],)

    def refuses(self, key: EndpointKey, feature: str) -> bool:
        """Whether `feature` of `key` is refused for every run or for the run learning now."""
        if feature in self._rejected.get(key, frozenset()):
            return True
        run = LEARNING_RUN.get()
        return run is not None and feature in self._own.get((run, key), frozenset())

    def record(self, key: EndpointKey, mode: OutputMode) -> None:
        """Remember that `mode` produced valid output for `key` (which also ends a run of
        answers that ignored it)."""
        counted = (key, mode, LEARNING_RUN.get())
        if self._worked.get(key) != mode or counted in self._ignored:
            changed = self._worked.get(key) != mode
            with self._lock:
                self._worked[key] = mode
                self._ignored.pop(counted, None)
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
                self._evidence.clear()
                self._worked.clear()
                self._ignored.clear()
                self._strikes.clear()
                self._own.clear()
            else:
                self._rejected.pop(key, None)
                self._evidence.pop(key, None)
                self._worked.pop(key, None)
                for entry in [e for e in self._ignored if e[0] == key]:
                    del self._ignored[entry]
                for strike in [e for e in self._strikes if e[0] == key]:
                    del self._strikes[strike]
                for own in [e for e in self._own if e[1] == key]:
                    del self._own[own]


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
