"""Checks: what makes a case run pass. Each says passed, failed or error, and why.

A check that cannot run (an expression reading what the result does not have, a judge that
does not answer, a scorer that raises) is an *error*: never a pass, never a silent zero.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from minions._text import as_text, jsonable
from minions.errors import did_you_mean
from minions.evals._run import CaseRun

if TYPE_CHECKING:
    from minions.evals._judge import Judge

__all__ = [
    "Check",
    "CheckResult",
    "ExpectedCheck",
    "ExprCheck",
    "FunctionCheck",
    "Grading",
    "JudgeCheck",
    "ToolExpectation",
    "TrajectoryCheck",
]

Outcome = Literal["passed", "failed", "error"]
"""What a check found: the run passed it, failed it, or the check could not run."""

Order = Literal["exact", "in_order", "any", "subset", "superset"]

_SHOWN = 120
"""How many characters of a value a reason quotes."""


def shown(value: Any, limit: int = _SHOWN) -> str:
    """A value as a reason quotes it: JSON, cut to `limit` characters."""
    text = repr(value) if isinstance(value, str) else as_text(jsonable(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    """What one check said of one case run."""

    check: str
    """The check's name (``expr: contains(output, 'Paris')``, or the one it was given)."""
    outcome: Outcome
    reason: str

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"


@dataclass(frozen=True, kw_only=True)
class Grading:
    """What checks share while an eval grades its runs.

    Attributes:
        judge: grades `JudgeCheck` rubrics; ``None`` when the eval has no judge model.
    """

    judge: Judge | None = None


class Check(ABC):
    """A check of a case run: subclass it, or give a case a plain function
    (see `FunctionCheck`)."""

    name: str = "check"

    @abstractmethod
    async def check(self, run: CaseRun, grading: Grading) -> CheckResult:
        """Grade one run. Raise, or return an ``"error"`` result, when it cannot be graded."""

    def passed(self, reason: str) -> CheckResult:
        return CheckResult(check=self.name, outcome="passed", reason=reason)

    def failed(self, reason: str) -> CheckResult:
        return CheckResult(check=self.name, outcome="failed", reason=reason)

    def error(self, reason: str) -> CheckResult:
        return CheckResult(check=self.name, outcome="error", reason=reason)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


# -- expected ------------------------------------------------------------------------------------


def mismatch(expected: Any, actual: Any, path: str = "output") -> str | None:
    """Why `actual` does not match `expected` (equal; for objects, every expected key equal,
    deeply, others allowed), or ``None`` when it does."""
    if isinstance(expected, Mapping):
        if not isinstance(actual, Mapping):
            return f"{path} is {shown(actual)}, expected an object with {shown(expected)}"
        for key, value in expected.items():
            if key not in actual:
                return (
                    f"{path} has no key {key!r} (it has: {', '.join(map(str, actual)) or 'none'})"
                )
            found = mismatch(value, actual[key], f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return f"{path} has {len(actual)} items, expected {len(expected)}"
        for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
            found = mismatch(want, got, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    if expected == actual and type(expected) is type(actual):
        return None
    numbers = all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in (expected, actual)
    )
    if numbers and expected == actual:
        return None
    return f"{path} is {shown(actual)}, expected {shown(expected)}"


class ExpectedCheck(Check):
    """The run's output is the case's `expected` (equal; for an object, a subset: every key
    it gives is equal, deeply, and the output may have more)."""

    def __init__(self, expected: Any) -> None:
        self.expected = jsonable(expected)
        self.name = "expected"

    async def check(self, run: CaseRun, grading: Grading) -> CheckResult:
        found = mismatch(self.expected, run.output)
        if found is None:
            return self.passed(f"output matches {shown(self.expected, 60)}")
        return self.failed(found)


# -- expr ----------------------------------------------------------------------------------------


def compile_expr(expression: str) -> Any:
    """The compiled JMESPath expression.

    Raises:
        ValueError: it is not valid JMESPath (the message says where).
    """
    import jmespath
    from jmespath.exceptions import JMESPathError

    if not expression.strip():
        raise ValueError("the expression is empty")
    try:
        return jmespath.compile(expression)
    except JMESPathError as exc:
        detail = str(exc).splitlines()[0].rstrip(": ") if str(exc) else type(exc).__name__
        column = getattr(exc, "lex_position", None)
        if isinstance(column, int):
            detail += f" at column {column + 1}"
        raise ValueError(f"invalid JMESPath {expression!r}: {detail}") from None


class ExprCheck(Check):
    """A JMESPath predicate over the run's result document (the language of templates):
    ``contains(output, 'Paris')``, ``steps.lookup.status == 'completed'``,
    ``length(tool_calls) <= `3```. It passes when it is true, fails when it is false, and
    is an error when it reads a field the document does not have, or gives something other
    than true or false.

    Raises:
        ValueError: the expression is not valid JMESPath.
    """

    def __init__(self, expression: str, *, name: str | None = None) -> None:
        self.expression = expression
        self.compiled = compile_expr(expression)
        self.name = name or f"expr: {expression}"

    async def check(self, run: CaseRun, grading: Grading) -> CheckResult:
        from jmespath.exceptions import JMESPathError

        from minions._templates import field_paths, missing_fields

        document = run.document
        missing = missing_fields(self.expression, document)
        if missing:
            part, keys = _keys_beside(document, missing[0])
            hint = did_you_mean(part, keys)
            return self.error(
                f"{self.expression!r} reads {', '.join(map(repr, missing))}, which the result "
                f"does not have{hint} (it has: {', '.join(keys[:20]) or 'nothing'})"
            )
        try:
            value = self.compiled.search(document)
        except JMESPathError as exc:
            return self.error(f"{self.expression!r} cannot be evaluated: {exc}")
        if value is True:
            return self.passed(f"{self.expression} is true")
        if value is False:
            values = _read_values(field_paths(self.expression), document)
            return self.failed(f"{self.expression} is false" + (f" ({values})" if values else ""))
        return self.error(
            f"{self.expression!r} must be true or false; it gave {shown(value, 60)} "
            "(compare it with something, e.g. == 'x', or wrap it in contains(...))"
        )


def _keys_beside(document: Mapping[str, Any], missing: str) -> tuple[str, list[str]]:
    """The first missing part of a dotted path, and the keys beside it."""
    current: Any = document
    for part in missing.split("."):
        if not isinstance(current, Mapping) or part not in current:
            keys = [str(k) for k in current] if isinstance(current, Mapping) else []
            return part, keys
        current = current[part]
    return "", []


def _read_values(paths: set[tuple[str, ...]], document: Mapping[str, Any]) -> str:
    parts = []
    for path in sorted(paths)[:3]:
        current: Any = document
        for key in path:
            current = current.get(key) if isinstance(current, Mapping) else None
        parts.append(f"{'.'.join(path)} = {shown(current, 80)}")
    return "; ".join(parts)


# -- trajectory ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ToolExpectation:
    """A tool call a trajectory expects: its name, and optionally arguments it must have
    (equal; for objects, a subset)."""

    name: str
    args: Mapping[str, Any] | None = None

    def matches(self, call: Mapping[str, Any]) -> bool:
        if call.get("name") != self.name:
            return False
        return self.args is None or mismatch(self.args, call.get("arguments", {})) is None

    def __str__(self) -> str:
        if self.args is None:
            return self.name
        return f"{self.name}({as_text(jsonable(self.args))})"


def _as_expectation(item: str | ToolExpectation | Mapping[str, Any]) -> ToolExpectation:
    if isinstance(item, ToolExpectation):
        return item
    if isinstance(item, str):
        return ToolExpectation(name=item)
    return ToolExpectation(name=str(item["name"]), args=item.get("args"))


def _matching(
    expected: Sequence[Any], actual: Sequence[Any], fits: Callable[[Any, Any], bool]
) -> int:
    """The most pairs of (expected, actual) items that fit, each used once (a maximum
    bipartite matching: Kuhn's augmenting paths; trajectories are short)."""
    owner: dict[int, int] = {}

    def place(i: int, seen: set[int]) -> bool:
        for j, item in enumerate(actual):
            if j in seen or not fits(expected[i], item):
                continue
            seen.add(j)
            if j not in owner or place(owner[j], seen):
                owner[j] = i
                return True
        return False

    return sum(1 for i in range(len(expected)) if place(i, set()))


def order_problem(
    mode: Order,
    expected: Sequence[Any],
    actual: Sequence[Any],
    fits: Callable[[Any, Any], bool],
) -> str | None:
    """Why `actual` does not follow `expected` in `mode`, or ``None`` when it does."""
    if mode == "exact":
        if len(expected) == len(actual) and all(
            fits(e, a) for e, a in zip(expected, actual, strict=True)
        ):
            return None
        return "is not exactly the expected sequence"
    if mode == "in_order":
        position = 0
        for item in actual:
            if position < len(expected) and fits(expected[position], item):
                position += 1
        if position == len(expected):
            return None
        return f"never came to {expected[position]} in that order"
    if mode == "subset":
        extra = [a for a in actual if not any(fits(e, a) for e in expected)]
        return None if not extra else f"also used {_names(extra)}, which is not expected"
    matched = _matching(expected, actual, fits)
    if mode == "superset":
        return None if matched == len(expected) else "lacks some of the expected"
    # any: the same items, in any order.
    if matched == len(expected) == len(actual):
        return None
    return "is not the expected items in some order"


def _names(items: Sequence[Any]) -> str:
    return ", ".join(str(i.get("name")) if isinstance(i, Mapping) else str(i) for i in items)


class TrajectoryCheck(Check):
    """How the run went: which tools it called and which steps ran, in which order, and
    within which bounds.

    Args:
        tools: the expected tool calls: names, or `ToolExpectation` (a name and arguments it
            must have; ``{"name": ..., "args": {...}}`` in YAML).
        steps: the expected steps (ids), as they started.
        order: how `tools` and `steps` are compared with what ran: ``exact`` (the same
            sequence), ``in_order`` (these, in this order, others may come between),
            ``any`` (the same ones in any order, nothing else), ``superset`` (at least
            these, in any order) or ``subset`` (nothing but these; not all need be used).
        max_model_calls: at most this many model calls in the run (retries count).
        max_tokens: at most this many tokens in the run.
        max_seconds: at most this long.
        no_repeated_calls: no tool called twice with the same arguments.
        name: the check's name in reports.
    """

    def __init__(
        self,
        *,
        tools: Sequence[str | ToolExpectation | Mapping[str, Any]] | None = None,
        steps: Sequence[str] | None = None,
        order: Order = "in_order",
        max_model_calls: int | None = None,
        max_tokens: int | None = None,
        max_seconds: float | None = None,
        no_repeated_calls: bool = False,
        name: str | None = None,
    ) -> None:
        self.tools = None if tools is None else tuple(_as_expectation(t) for t in tools)
        self.steps = None if steps is None else tuple(steps)
        self.order: Order = order
        self.max_model_calls = max_model_calls
        self.max_tokens = max_tokens
        self.max_seconds = max_seconds
        self.no_repeated_calls = no_repeated_calls
        self.name = name or f"trajectory: {self._summary()}"

    def _summary(self) -> str:
        parts = []
        if self.tools is not None:
            parts.append(f"tools {self.order} [{', '.join(map(str, self.tools))}]")
        if self.steps is not None:
            parts.append(f"steps {self.order} [{', '.join(self.steps)}]")
        for label, value in (
            ("max_model_calls", self.max_model_calls),
            ("max_tokens", self.max_tokens),
            ("max_seconds", self.max_seconds),
        ):
            if value is not None:
                parts.append(f"{label} {value}")
        if self.no_repeated_calls:
            parts.append("no repeated calls")
        return ", ".join(parts) or "anything"

    async def check(self, run: CaseRun, grading: Grading) -> CheckResult:
        document = run.document
        calls = [c for c in document.get("tool_calls", []) if isinstance(c, Mapping)]
        problems = []
        if self.tools is not None:
            found = order_problem(self.order, self.tools, calls, lambda e, a: e.matches(a))
            if found:
                want = ", ".join(map(str, self.tools)) or "none"
                problems.append(
                    f"tools: the run called [{_calls(calls)}], which {found} "
                    f"({self.order} [{want}])"
                )
        if self.steps is not None:
            ran = list(document.get("step_order", []))
            found = order_problem(self.order, self.steps, ran, lambda e, a: e == a)
            if found:
                problems.append(
                    f"steps: [{', '.join(ran)}] ran, which {found} "
                    f"({self.order} [{', '.join(self.steps)}])"
                )
        limits = (
            ("model calls", self.max_model_calls, document.get("model_calls", 0)),
            ("tokens", self.max_tokens, document.get("usage", {}).get("total_tokens", 0)),
            ("seconds", self.max_seconds, document.get("duration", 0.0)),
        )
        for label, limit, used in limits:
            if limit is not None and used > limit:
                amount = f"{used:.2f}" if isinstance(used, float) else str(used)
                problems.append(f"{amount} {label}, more than the {limit} allowed")
        if self.no_repeated_calls:
            seen: set[str] = set()
            for call in calls:
                key = f"{call.get('name')}({as_text(call.get('arguments', {}))})"
                if key in seen:
                    problems.append(f"{key} was called more than once")
                    break
                seen.add(key)
        if problems:
            return self.failed("; ".join(problems))
        return self.passed(f"called [{_calls(calls)}]" if calls else "as expected")


def _calls(calls: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(str(c.get("name")) for c in calls) or "no tool"


# -- judge ---------------------------------------------------------------------------------------


class JudgeCheck(Check):
    """A rubric a model grades the run's output against, answering pass or fail with a reason
    (structured output). `{{ ... }}` templates in the rubric read the result document
    (``Names the capital of {{ inputs.country }}.``). The verdicts are cached by (rubric,
    output, judge model). Without a judge model, the check is an error.
    """

    def __init__(self, rubric: str, *, name: str | None = None) -> None:
        from minions._templates import check_template

        problems = check_template(rubric, _DOCUMENT_KEYS)
        if problems:
            raise ValueError(problems[0])
        self.rubric = rubric
        self.name = name or f"judge: {rubric}"

    async def check(self, run: CaseRun, grading: Grading) -> CheckResult:
        from minions._templates import render_text
        from minions.errors import TemplateError

        if grading.judge is None:
            return self.error(
                "no judge model: give one with --judge-model (judge_model= in Python)"
            )
        try:
            rubric = render_text(self.rubric, run.document)
        except TemplateError as exc:
            return self.error(f"the rubric cannot be rendered: {exc}")
        verdict = await grading.judge.grade(rubric, run.output)
        if verdict.error is not None:
            return self.error(verdict.error)
        return self.passed(verdict.reason) if verdict.passed else self.failed(verdict.reason)


_DOCUMENT_KEYS = frozenset(
    {
        "run_id", "target", "status", "output", "error", "inputs", "expected", "usage",
        "duration", "model_calls", "steps", "tool_calls", "step_order",
    }
)  # fmt: skip


# -- python --------------------------------------------------------------------------------------

CheckFunction = Callable[[CaseRun], Any]
"""A scorer: given the `CaseRun`, returns ``True``/``False``, ``(passed, reason)`` or a
`CheckResult` (or an awaitable of one)."""


class FunctionCheck(Check):
    """A Python function as a check (``python: module:function`` in YAML): it gets the
    `CaseRun` and returns ``True``/``False``, ``(passed, reason)`` or a `CheckResult`, sync
    or async. If it raises, or returns anything else, the check is an error.
    """

    def __init__(self, function: CheckFunction, *, name: str | None = None) -> None:
        self.function = function
        label = getattr(function, "__qualname__", None) or type(function).__name__
        self.name = name or f"python: {label}"

    async def check(self, run: CaseRun, grading: Grading) -> CheckResult:
        try:
            value = self.function(run)
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            return self.error(f"the scorer raised {type(exc).__name__}: {exc}")
        return self._result(value)

    def _result(self, value: Any) -> CheckResult:
        if isinstance(value, CheckResult):
            return value
        if isinstance(value, bool):
            return self.passed("returned True") if value else self.failed("returned False")
        if (
            isinstance(value, tuple)
            and len(value) == 2
            and isinstance(value[0], bool)
            and isinstance(value[1], str)
        ):
            return self.passed(value[1]) if value[0] else self.failed(value[1])
        return self.error(
            f"the scorer returned {shown(value, 60)}; return True/False, (passed, reason) "
            "or a CheckResult"
        )


def as_check(check: Check | Callable[[CaseRun], Any]) -> Check:
    """A `Check`, or a function made one (`FunctionCheck`)."""
    if isinstance(check, Check):
        return check
    if callable(check):
        return FunctionCheck(check)
    raise TypeError(f"a check must be a Check or a function of a CaseRun, not {check!r}")


async def run_check(check: Check, run: CaseRun, grading: Grading) -> CheckResult:
    """`check.check`, with an exception turned into an error result."""
    try:
        return await check.check(run, grading)
    except Exception as exc:
        return check.error(f"the check raised {type(exc).__name__}: {exc}")
