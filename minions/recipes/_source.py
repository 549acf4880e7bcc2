"""Reading YAML while keeping the line of every key and item, for error messages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from minions.errors import Problem, RecipeError

__all__ = []

Path_ = tuple[str | int, ...]


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

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        located = Located(data=None, file=file)
        if node is not None:
            located.data = _build(loader, node, (), located.lines)
        return located
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


def _build(loader: Any, node: Any, path: Path_, lines: dict[Path_, int]) -> Any:
    import yaml

    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if isinstance(key, Mapping | list):
                key = str(key)
            lines[(*path, key)] = key_node.start_mark.line + 1
            result[key] = _build(loader, value_node, (*path, key), lines)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_build(loader, item, (*path, i), lines) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)
