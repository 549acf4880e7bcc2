"""Reading YAML while keeping the line of every key and item, for error messages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from minions.errors import Problem, RecipeError

__all__ = []

Path_ = tuple[str | int, ...]

MAX_NODES = 100_000
"""How many values a YAML document may hold once its aliases are expanded (an "alias bomb"
of a few hundred bytes would otherwise take gigabytes)."""
MAX_DEPTH = 64
"""How deeply a YAML document may nest."""


class _Refused(Exception):
    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


@dataclass
class Located:
    """A YAML document's data, and the line of each path in it (1-based)."""

    data: Any
    file: str = ""
    lines: dict[Path_, int] = field(default_factory=dict)

    def line(self, path: Sequence[str | int]) -> int | None:
        """The line of `path`, or of its nearest parent that has one."""
        current: Path_ = tuple(path)
        while True:
            if current in self.lines:
                return self.lines[current]
            if not current:
                return None
            current = current[:-1]


def load_yaml(text: str, file: str = "") -> Located:
    """Parse YAML (safe subset) and remember where every key and list item is.

    Raises:
        RecipeError: the text is not valid YAML (with the line and column of the problem).
    """
    import yaml

    try:
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (a NUL byte)
        where = text.count("\n", 0, max(exc.position, 0)) + 1
        character = exc.character if isinstance(exc.character, str) else chr(exc.character)
        message = f"invalid YAML: character {character!r} is not allowed in YAML text"
        raise RecipeError([Problem(message=message, file=file, line=where)]) from None
    try:
        node = loader.get_single_node()
        located = Located(data=None, file=file)
        if node is not None:
            located.data = _build(loader, node, (), located.lines, [0])
        return located
    except _Refused as exc:
        raise RecipeError([Problem(message=str(exc), file=file, line=exc.line)]) from None
    except RecursionError:
        message = f"the YAML nests too deeply (more than {MAX_DEPTH} levels are refused)"
        raise RecipeError([Problem(message=message, file=file)]) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or str(exc)
        if mark is not None:
            problem += f" (column {mark.column + 1})"
        raise RecipeError(
            [Problem(message=f"invalid YAML: {problem}", file=file, line=line)]
        ) from None
    except yaml.YAMLError as exc:
        raise RecipeError([Problem(message=f"invalid YAML: {exc}", file=file)]) from None
    finally:
        loader.dispose()


def _build(loader: Any, node: Any, path: Path_, lines: dict[Path_, int], count: list[int]) -> Any:
    import yaml

    line = node.start_mark.line + 1
    count[0] += 1
    if count[0] > MAX_NODES:
        raise _Refused(
            f"the YAML holds more than {MAX_NODES:,} values once its aliases are expanded "
            "(an alias bomb?); refused",
            line,
        )
    if len(path) > MAX_DEPTH:
        raise _Refused(f"the YAML nests deeper than {MAX_DEPTH} levels; refused", line)
    lines.setdefault(path, line)
    if isinstance(node, yaml.MappingNode):
        _check_duplicate_keys(node)
        loader.flatten_mapping(node)
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if isinstance(key, Mapping | list):
                key = str(key)
            lines[(*path, key)] = key_node.start_mark.line + 1
            result[key] = _build(loader, value_node, (*path, key), lines, count)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_build(loader, item, (*path, i), lines, count) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def _check_duplicate_keys(node: Any) -> None:
    """Two equal keys in one mapping: YAML would keep the last silently."""
    import yaml

    seen: dict[str, int] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
            continue
        line = key_node.start_mark.line + 1
        if key_node.value in seen:
            first = seen[key_node.value]
            raise _Refused(
                f"the key {key_node.value!r} is given twice (lines {first} and {line}); "
                "only one is kept, so say it once",
                line,
            )
        seen[key_node.value] = line
