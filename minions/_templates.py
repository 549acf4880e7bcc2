"""`{{ expression }}` templates: JMESPath over run state.

Run state is a mapping such as ``{"inputs": {...}, "wiki": {"output": ..., "status": ...},
"loop": {"item": ..., "index": 0}}``. Rules:

* a string that is exactly one expression keeps the value's type (a list stays a list);
* expressions embedded in text become text (JSON for lists and objects);
* a missing value is an error naming the expression. ``None`` is only accepted when the path
  to it exists (e.g. the output of an optional step that failed); give a default with
  ``{{ x || 'none' }}``.

Expressions are parsed once and cached; `check_template` parses every expression of a value
and reports the roots it refers to, so recipes are checked when they load.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from minions._text import as_text
from minions.errors import TemplateError, TemplateSyntaxError, did_you_mean

__all__ = []

_EXPRESSION = re.compile(r"\{\{\s*((?:(?!\{\{|\}\}).)*?)\s*\}\}", re.DOTALL)
_MISSING = object()


@dataclass(frozen=True, slots=True)
class _Compiled:
    source: str
    parsed: Any  # jmespath.parser.ParsedResult
    path: tuple[Any, ...] | None
    """For a plain path (``a.b[0].c``), its keys and indexes; used to tell null from missing."""
    roots: frozenset[str]


def has_template(value: Any) -> bool:
    """Whether a value (string, list or mapping, searched deeply) holds an expression."""
    if isinstance(value, str):
        return "{{" in value
    if isinstance(value, Mapping):
        return any(has_template(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(has_template(v) for v in value)
    return False


def template_expressions(value: Any) -> list[str]:
    """Every expression in a value, searched deeply, in order."""
    if isinstance(value, str):
        return [m.group(1) for m in _EXPRESSION.finditer(value)]
    if isinstance(value, Mapping):
        return [e for v in value.values() for e in template_expressions(v)]
    if isinstance(value, list | tuple):
        return [e for v in value for e in template_expressions(v)]
    return []


@lru_cache(maxsize=4096)
def _compile(expression: str) -> _Compiled:
    import jmespath
    from jmespath.exceptions import JMESPathError

    if not expression:
        raise TemplateSyntaxError("empty template expression {{ }}", expression=expression)
    try:
        parsed = jmespath.compile(expression)
    except JMESPathError as exc:
        detail = str(exc).splitlines()[0].rstrip(": ") if str(exc) else type(exc).__name__
        column = getattr(exc, "lex_position", None)
        if isinstance(column, int):
            detail += f" at column {column + 1} of the expression"
        raise TemplateSyntaxError(
            f"invalid template expression {{{{ {expression} }}}}: {detail}", expression=expression
        ) from None
    negated = _negated_path(parsed.parsed)
    if negated:
        text = expression.strip()
        fix = (
            f"write !({text[1:].strip()}) instead"
            if text.startswith("!")
            else f"put the whole path in parentheses: !({negated}...)"
        )
        raise TemplateSyntaxError(
            f"template {{{{ {expression} }}}} negates {negated!r} before reading the rest of the "
            f"path (JMESPath binds '!' tightly); {fix}",
            expression=expression,
        )
    return _Compiled(
        expression, parsed, _plain_path(parsed.parsed), frozenset(_roots(parsed.parsed))
    )


def _negated_path(node: Mapping[str, Any]) -> str | None:
    """The operand of a ``!`` that a path continues from (``!a.b`` reads ``(!a).b``), if any."""
    kind = node["type"]
    children = node.get("children", [])
    if kind == "subexpression" and children:
        first = children[0]
        if first["type"] == "not_expression":
            operand = first["children"][0]
            return str(operand.get("value", "the expression"))
    for child in children:
        if isinstance(child, Mapping):
            found = _negated_path(child)
            if found:
                return found
    return None


def _plain_path(node: Mapping[str, Any]) -> tuple[Any, ...] | None:
    kind = node["type"]
    if kind == "field":
        return (node["value"],)
    if kind == "subexpression":
        parts: tuple[Any, ...] = ()
        for child in node["children"]:
            sub = _plain_path(child)
            if sub is None:
                return None
            parts += sub
        return parts
    if kind == "index_expression":
        left, right = node["children"]
        head = _plain_path(left)
        if head is None or right["type"] != "index":
            return None
        return (*head, right["value"])
    return None


def _roots(node: Mapping[str, Any]) -> set[str]:
    """The top-level names an expression reads from run state."""
    kind = node["type"]
    children = node.get("children", [])
    if kind == "field":
        return {node["value"]}
    if kind in {
        "subexpression",
        "index_expression",
        "projection",
        "value_projection",
        "filter_projection",
        "flatten",
        "pipe",
        "key_val_pair",
    }:
        # Only the leftmost part reads run state; the rest reads what it produced.
        return _roots(children[0]) if children else set()
    if kind in {"expref", "literal", "current", "identity", "index", "slice"}:
        return set()
    found: set[str] = set()
    for child in children:
        found |= _roots(child)
    return found


def _field_paths(node: Mapping[str, Any]) -> set[tuple[str, ...]]:
    """The chains of field names an expression reads from run state, from the root (for
    ``output.a.b[0].c == x.d``: ``(output, a, b)`` and ``(x, d)``)."""
    kind = node["type"]
    children = node.get("children", [])
    if kind in {"field", "subexpression", "index_expression"}:
        leading = _leading_fields(node)
        return {leading} if leading else set()
    if kind in {
        "projection",
        "value_projection",
        "filter_projection",
        "flatten",
        "pipe",
    }:
        return _field_paths(children[0]) if children else set()
    if kind in {"expref", "literal", "current", "identity", "index", "slice", "key_val_pair"}:
        return set()
    found: set[tuple[str, ...]] = set()
    for child in children:
        if isinstance(child, Mapping):
            found |= _field_paths(child)
    return found


def _leading_fields(node: Mapping[str, Any]) -> tuple[str, ...]:
    """``a.b[0].c`` gives ``(a, b)``: the fields before anything but a field."""
    kind = node["type"]
    if kind == "field":
        return (str(node["value"]),)
    if kind == "index_expression":
        return _leading_fields(node["children"][0])
    if kind != "subexpression":
        return ()
    fields: tuple[str, ...] = ()
    for child in node["children"]:
        if child["type"] == "field":
            fields += (str(child["value"]),)
            continue
        if child["type"] == "index_expression" or not fields:
            fields += _leading_fields(child)
        elif child["type"] in {"projection", "filter_projection", "flatten"}:
            fields += _leading_fields(child["children"][0])
        break
    return fields


def field_paths(expression: str) -> set[tuple[str, ...]]:
    """The field chains `expression` reads from run state (see `_field_paths`); empty for an
    invalid expression."""
    try:
        return _field_paths(_compile(expression).parsed.parsed)
    except TemplateSyntaxError:
        return set()


def missing_fields(expression: str, state: Mapping[str, Any]) -> list[str]:
    """The field chains of `expression` that `state` does not have, as dotted text."""
    return sorted(
        ".".join(path) for path in field_paths(expression) if _lookup(state, path) is _MISSING
    )


def bare_comparands(expression: str) -> set[str]:
    """Names compared as a whole (``output.topic == billing`` gives ``billing``): in a
    condition, usually a literal someone forgot to quote."""
    try:
        tree = _compile(expression).parsed.parsed
    except TemplateSyntaxError:
        return set()
    found: set[str] = set()

    def walk(node: Mapping[str, Any]) -> None:
        children = node.get("children", [])
        if node["type"] == "comparator":
            found.update(str(c["value"]) for c in children if c["type"] == "field")
        for child in children:
            if isinstance(child, Mapping):
                walk(child)

    walk(tree)
    return found


def quoted_outputs(value: Any) -> set[str]:
    """The names whose whole ``.output`` a value's templates quote (``{{ plan.output }}``, not
    ``{{ plan.output.title }}``): a prompt holding these need not repeat those outputs."""
    found = set()
    for expression in template_expressions(value):
        try:
            path = _compile(expression).path
        except TemplateSyntaxError:
            continue
        if path is not None and len(path) == 2 and path[1] == "output":
            found.add(str(path[0]))
    return found


def template_roots(value: Any) -> set[str]:
    """The top-level names all expressions in a value read.

    Raises:
        TemplateSyntaxError: an expression is not valid JMESPath.
    """
    roots: set[str] = set()
    for expression in template_expressions(value):
        roots |= _compile(expression).roots
    return roots


def check_template(value: Any, known_roots: Sequence[str] | Set[str]) -> list[str]:
    """Problems with the expressions of a value: invalid syntax, or roots not in `known_roots`.

    Returns one message per problem, empty when all is well.
    """
    problems = []
    known = known_roots if isinstance(known_roots, Set) else set(known_roots)
    for expression in template_expressions(value):
        try:
            compiled = _compile(expression)
        except TemplateSyntaxError as exc:
            problems.append(str(exc))
            continue
        for root in sorted(compiled.roots - known):
            hint = did_you_mean(root, sorted(known))
            problems.append(
                f"template {{{{ {expression} }}}} refers to {root!r}, which is not an input, "
                f"a step or a saved result{hint}"
            )
    return problems


def _lookup(state: Any, path: tuple[Any, ...]) -> Any:
    current = state
    for key in path:
        if isinstance(key, int):
            if not isinstance(current, list | tuple) or not -len(current) <= key < len(current):
                return _MISSING
            current = current[key]
        elif isinstance(current, Mapping) and key in current:
            current = current[key]
        else:
            return _MISSING
    return current


def _evaluate(expression: str, state: Mapping[str, Any]) -> Any:
    compiled = _compile(expression)
    if compiled.path is not None:
        value = _lookup(state, compiled.path)
        if value is _MISSING:
            raise TemplateError(
                _missing_message(expression, state), expression=expression, missing=True
            )
        return value
    from jmespath.exceptions import JMESPathError

    try:
        value = compiled.parsed.search(state)
    except JMESPathError as exc:
        raise TemplateError(
            f"template {{{{ {expression} }}}} failed: {exc}", expression=expression
        ) from None
    if value is None:
        raise TemplateError(
            _missing_message(expression, state), expression=expression, missing=True
        )
    return value


def _missing_message(expression: str, state: Mapping[str, Any]) -> str:
    available = ", ".join(sorted(state)) or "nothing"
    return (
        f"template {{{{ {expression} }}}} has no value (run state has: {available}); "
        f"give a default with {{{{ {expression} || 'default' }}}}"
    )


def _embedded(value: Any) -> str:
    """A value inside text: `as_text`, with a null as nothing."""
    return "" if value is None else as_text(value)


def render_text(text: str, state: Mapping[str, Any]) -> str:
    """Render a string, always returning text."""
    value = render(text, state)
    return _embedded(value)


def render(value: Any, state: Mapping[str, Any]) -> Any:
    """Render every expression in a value (string, list or mapping, deeply).

    Raises:
        TemplateError: a value is missing, naming the expression.
        TemplateSyntaxError: an expression is not valid JMESPath.
    """
    if isinstance(value, str):
        if "{{" not in value:
            return value
        whole = _EXPRESSION.fullmatch(value.strip())
        if whole is not None:
            return _evaluate(whole.group(1), state)
        return _EXPRESSION.sub(lambda m: _embedded(_evaluate(m.group(1), state)), value)
    if isinstance(value, Mapping):
        return {k: render(v, state) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [render(v, state) for v in value]
    return value
