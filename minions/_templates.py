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

Templates look like Jinja's and are not: an expression that fails, or has no value, and reads
like Jinja (``x | upper``, ``x['key']``, ``default('n/a')``, ``{% if %}``) is answered with
"templates are JMESPath, not Jinja" and the JMESPath to write instead, where there is one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

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
        hint = jinja_hint(expression)
        if hint is not None:
            detail = hint  # what to write instead says more than where the parser stopped
        raise TemplateSyntaxError(
            f"invalid template expression {{{{ {expression} }}}}: {detail}", expression=expression
        ) from None
    called = _function_problem(expression, parsed.parsed)
    if called is not None:
        raise TemplateSyntaxError(
            f"invalid template expression {{{{ {expression} }}}}: {called}", expression=expression
        )
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
    problems = jinja_blocks(value)
    known = known_roots if isinstance(known_roots, Set) else set(known_roots)
    for expression in template_expressions(value):
        try:
            compiled = _compile(expression)
        except TemplateSyntaxError as exc:
            problems.append(str(exc))
            continue
        filtered = _jinja_pipe(expression)
        if filtered is not None:
            problems.append(filtered)
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
    hint = filter_hint(expression)
    if hint is not None:
        return f"template {{{{ {expression} }}}} has no value: {hint}"
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


# -- Jinja habits --------------------------------------------------------------------------------

NOT_JINJA: Final = "templates are JMESPath, not Jinja"

_TEXT_ADVICE: Final = (
    "write {{{{ {x} }}}} and say in the prompt what to do with it, or compute it in a tool "
    "step or in your code before the run"
)
_FILTER_ADVICE: Final = "filter a list with {{{{ {x}[?field == 'value'] }}}}"

# Jinja's filters and their JMESPath form: `{x}` is the filtered value, `{arg}` the filter's
# argument (its default when it has none); `None` when JMESPath has no such thing, with what
# to do instead in `_NO_FORM`.
_JINJA_FILTERS: Final[Mapping[str, tuple[str | None, str]]] = {
    "length": ("length({x})", ""),
    "count": ("length({x})", ""),
    "default": ("{x} || {arg}", "'default'"),
    "d": ("{x} || {arg}", "'default'"),
    "join": ("join({arg}, {x})", "''"),
    "first": ("{x}[0]", ""),
    "last": ("{x}[-1]", ""),
    "sort": ("sort({x})", ""),
    "reverse": ("reverse({x})", ""),
    "sum": ("sum({x})", ""),
    "min": ("min({x})", ""),
    "max": ("max({x})", ""),
    "abs": ("abs({x})", ""),
    "list": ("to_array({x})", ""),
    "string": ("to_string({x})", ""),
    "tojson": ("to_string({x})", ""),
    "int": ("to_number({x})", ""),
    "float": ("to_number({x})", ""),
    "map": ("{x}[*].field", ""),
    **dict.fromkeys(("select", "reject", "selectattr", "rejectattr"), (None, _FILTER_ADVICE)),
    **dict.fromkeys(
        (
            "upper", "lower", "title", "capitalize", "trim", "replace", "truncate", "round",
            "wordcount", "wordwrap", "striptags", "escape", "e", "safe", "urlencode", "center",
            "indent", "format", "unique", "items", "dictsort", "batch", "slice", "groupby",
            "random", "filesizeformat", "pprint", "attr", "xmlattr", "urlize", "forceescape",
        ),
        (None, _TEXT_ADVICE),
    ),
}  # fmt: skip

_PLAUSIBLE_FIELDS: Final = frozenset(
    {
        "title", "first", "last", "count", "items", "min", "max", "sum", "format", "map",
        "select", "reject", "attr", "random", "batch", "slice", "groupby", "list", "string",
        "sort", "reverse", "unique", "center", "indent", "replace", "round", "abs", "int",
        "float", "e", "d",
    }
)  # fmt: skip
"""Filter names that are also likely field names: ``x | title`` may read a field ``title``,
so a recipe is only told about it when it has no value."""

_FILTER: Final = re.compile(r"^(?P<name>[A-Za-z_]\w*)\s*(?:\((?P<args>.*)\))?$", re.DOTALL)
_SUBSCRIPT: Final = re.compile(r"\[\s*(?P<quote>['\"])(?P<key>(?:(?!(?P=quote)).)*)(?P=quote)\s*\]")
_IDENTIFIER: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DOTTED_INDEX: Final = re.compile(r"(?<=[\w\]\"])\.(\d+)\b")
_WORDS: Final = ((re.compile(r"\band\b"), "&&"), (re.compile(r"\bor\b"), "||"))
_NOT: Final = re.compile(r"\bnot\s+([\w.\[\]]+)")
_BLOCK: Final = re.compile(
    r"\{%-?\s*(if|for|set|block|macro|raw|with|include|filter|call)\b[^%]*-?%\}"
)
"""A Jinja block's opening tag (its ``end...`` is the same mistake again)."""


def _unquoted(expression: str, change: Callable[[str], str]) -> str:
    """`expression` with `change` applied to its text outside quotes and JSON literals."""
    parts = re.split(r"('(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\"|`(?:\\.|[^`\\])*`)", expression)
    return "".join(part if index % 2 else change(part) for index, part in enumerate(parts))


def _pipe_parts(expression: str) -> list[str]:
    """`expression` split at its top-level pipes (``|``, not ``||``)."""
    parts: list[str] = []
    depth, quote, start, index = 0, "", 0, 0
    while index < len(expression):
        char = expression[index]
        if quote:
            if char == "\\":
                index += 1
            elif char == quote:
                quote = ""
        elif char in "'\"`":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "|" and depth == 0:
            if expression[index + 1 : index + 2] == "|":
                index += 2
                continue
            parts.append(expression[start:index].strip())
            start = index + 1
        index += 1
    parts.append(expression[start:].strip())
    return parts


def _compiles(expression: str) -> bool:
    try:
        _compile(expression)
    except TemplateSyntaxError:
        return False
    return True


def filter_hint(expression: str, *, bare: Set[str] | None = None) -> str | None:
    """What to write instead of Jinja filters piped into (``x | upper``, ``x | default('-')``),
    or `None` when `expression` pipes into no filter.

    Args:
        bare: the filter names that count when written without parentheses (every filter
            when `None`): ``x | title`` may mean a field ``title``.
    """
    parts = _pipe_parts(expression)
    if len(parts) < 2:
        return None
    value = parts[0]
    for part in parts[1:]:
        match = _FILTER.match(part)
        if match is None or match["name"] not in _JINJA_FILTERS:
            return None
        name, args = match["name"], match["args"]
        if args is None and bare is not None and name not in bare:
            return None
        form, default = _JINJA_FILTERS[name]
        if form is None:
            advice = default.format(x=value)
            return (
                f"{NOT_JINJA}: '| {name}' is a Jinja filter, and JMESPath has no {name}; {advice}"
            )
        # Jinja's "text" is JMESPath's 'text' ("text" names a field there).
        arg = re.sub(r'"((?:[^"\\]|\\.)*)"', r"'\1'", args.strip()) if args else default
        value = form.format(x=value, arg=arg)
    if not _compiles(value):
        return f"{NOT_JINJA}: JMESPath has no filters ('| name')"
    return f"{NOT_JINJA}: write {{{{ {value} }}}}"


def _jinja_pipe(expression: str) -> str | None:
    """A recipe's problem with a valid expression that pipes into a Jinja filter no field is
    likely named after (``inputs.city | upper``), or `None`."""
    unlikely = {name for name in _JINJA_FILTERS if name not in _PLAUSIBLE_FIELDS}
    hint = filter_hint(expression, bare=unlikely)
    if hint is None:
        return None
    field = _pipe_parts(expression)[-1]
    note = (
        f"; to read a field named {field!r}, write it after a dot"
        if _IDENTIFIER.match(field)
        else ""
    )
    return f"template {{{{ {expression} }}}}: {hint}{note}"


def _path_text(node: Mapping[str, Any]) -> str | None:
    """The text of a plain path (``a.b[0]``), or `None` for anything else."""
    path = _plain_path(node)
    if not path:
        return None
    text = ""
    for key in path:
        if isinstance(key, int):
            text += f"[{key}]"
        else:
            name = str(key) if _IDENTIFIER.match(str(key)) else json.dumps(key)
            text += f".{name}" if text else name
    return text


def _subscript(match: re.Match[str]) -> str:
    key = match["key"]
    return f".{key}" if _IDENTIFIER.match(key) else f".{json.dumps(key)}"


def _unjinja(text: str) -> str:
    """Unquoted text of an expression with Jinja's indexes and words in JMESPath."""
    text = _DOTTED_INDEX.sub(r"[\1]", text)
    for word, operator in _WORDS:
        text = word.sub(operator, text)
    return _NOT.sub(r"!(\1)", text)


def jinja_hint(expression: str) -> str | None:
    """For an expression JMESPath cannot parse: the JMESPath it reads like in Jinja (subscripts
    ``x['key']``, indexes ``x.0``, ``and`` / ``or`` / ``not``, filters), or `None`."""
    fixed = _unquoted(_SUBSCRIPT.sub(_subscript, expression), _unjinja)
    if fixed != expression and _compiles(fixed):
        return f"{NOT_JINJA}: write {{{{ {fixed} }}}}"
    return filter_hint(fixed)


def _function_problem(expression: str, tree: Mapping[str, Any]) -> str | None:
    """What is wrong with the functions an expression calls (one JMESPath does not have, or
    the wrong number of arguments), which would fail every time it is rendered; or `None`."""
    from jmespath.functions import Functions

    table: Mapping[str, Any] = Functions.FUNCTION_TABLE
    stack = [tree]
    while stack:
        node = stack.pop()
        stack.extend(child for child in node.get("children", ()) if isinstance(child, Mapping))
        if node["type"] != "function_expression":
            continue
        name, given = str(node["value"]), len(node.get("children", ()))
        spec = table.get(name)
        if spec is None:
            hint = filter_hint(expression)
            if hint is not None:
                return hint
            functions = f"(its functions: {', '.join(sorted(table))})"
            if name in _JINJA_FILTERS:
                form, advice = _JINJA_FILTERS[name]
                argument = _path_text(node["children"][0]) if node.get("children") else None
                if form is not None:
                    written = form.format(x=argument or "value", arg=advice or "'...'")
                    return (
                        f"{NOT_JINJA}: there is no {name}() in JMESPath; write {{{{ {written} }}}}"
                    )
                advice = advice.format(x=argument or "value")
                return f"{NOT_JINJA}: there is no {name}() in JMESPath; {advice} {functions}"
            close = did_you_mean(name, sorted(table))
            return f"there is no function {name}() in JMESPath{close} {functions}"
        signature = spec["signature"]
        variadic = bool(signature) and bool(signature[-1].get("variadic"))
        if given != len(signature) and not (variadic and given >= len(signature)):
            # A filter piped into (``x | join(', ')``) has its value as a missing argument.
            hint = filter_hint(expression)
            if hint is not None:
                return hint
            wanted = f"{len(signature)}{' or more' if variadic else ''}"
            return f"{name}() takes {wanted} argument{'s' if wanted != '1' else ''}, not {given}"
    return None


def jinja_blocks(value: Any) -> list[str]:
    """One problem per Jinja block (``{% if %}``, ``{% for %}``) in a value's text, which
    would be sent to the model as it is."""
    if isinstance(value, str):
        if "{%" not in value:
            return []
        return [
            f"template text {match.group(0)!r} is a Jinja block: {NOT_JINJA}, and have no "
            "{% %} blocks; choose text with {{ condition && 'yes' || 'no' }}, repeat a step "
            "with loop:, or write {{ '{%' }} for a literal '{%'"
            for match in _BLOCK.finditer(value)
        ]
    if isinstance(value, Mapping):
        return [p for v in value.values() for p in jinja_blocks(v)]
    if isinstance(value, list | tuple):
        return [p for v in value for p in jinja_blocks(v)]
    return []
