"""Reading YAML while keeping the line of every key and item, for error messages: recipes,
and the files that follow their format (eval datasets).

At the bottom of the layers, beside `minions._files`: what reads a YAML file a person wrote
reads it here, so no layer reaches into another's private module for it."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from minions.errors import Problem, RecipeError

__all__ = ["Located"]

Path_ = tuple[str | int, ...]

MAX_EXPANDED = 100_000
"""How many values a YAML document's aliases may add once expanded (an "alias bomb" of a few
hundred bytes would otherwise take gigabytes). Values written out in the text are not counted:
their number is bounded by the text's size, so a big recipe without aliases is judged by its
size alone."""
MAX_DEPTH = 64
"""How deeply a YAML document may nest."""


BIG_TEXT = 256 * 1024
"""Recipe text from this size on is read and checked with the cyclic garbage collector paused
(see `collector_paused`)."""

_pauses = 0
_collector_was_enabled = False
_pauses_lock = threading.Lock()


@contextmanager
def collector_paused(text: str) -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a big recipe `text` is read, checked and
    built (nothing for a small one).

    Reading a 20,000-step recipe makes a few million objects that all live until the end:
    each full collection walks every one of them, and more than half of the load went to
    collections that could free nothing. The pause lasts as long as the load (seconds at
    most), whoever else pauses meanwhile (threads loading recipes at once), and the
    collector is left as it was found.
    """
    global _pauses, _collector_was_enabled
    if len(text) < BIG_TEXT:
        yield
        return
    with _pauses_lock:
        if _pauses == 0:
            _collector_was_enabled = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _pauses_lock:
            _pauses -= 1
            if _pauses == 0 and _collector_was_enabled:
                gc.enable()


class _Refused(Exception):
    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


@dataclass
class Located:
    """A YAML document's data, and the line of each path in it (1-based): what `parse_spec`
    returns beside the recipe, and `RecipeFile.located`, so that a problem found later (by
    your own checks too) can name its line.

    Attributes:
        data: the document, as plain values (mappings, lists, strings, numbers...).
        file: the file it was read from (``""`` for text).
        lines: the line of each path in `data` (``("steps", 0, "goal")``: the first step's
            goal).

    Example:
        ``spec, located = parse_spec(text)`` then ``located.line(["steps", 2, "tools"])``:
        the line of the third step's tools, or of the step itself when it names none.
    """

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

    # libyaml's parser, where PyYAML was built with it, is several times faster than the pure
    # Python one: a 20,000-step recipe is read in seconds, not tens of them.
    loader_class = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loader = None
    try:
        loader = loader_class(text)
        node = loader.get_single_node()
        located = Located(data=None, file=file)
        if node is not None:
            located.data = _Builder(loader, located.lines).build(node, (), expanded=False)
        return located
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (a NUL byte)
        where = text.count("\n", 0, max(exc.position, 0)) + 1
        character = exc.character if isinstance(exc.character, str) else chr(exc.character)
        message = f"invalid YAML: character {character!r} is not allowed in YAML text"
        raise RecipeError([Problem(message=message, file=file, line=where)]) from None
    except _Refused as exc:
        raise RecipeError([Problem(message=str(exc), file=file, line=exc.line)]) from None
    except RecursionError:
        raise RecipeError([Problem(message=_TOO_DEEP, file=file)]) from None
    except yaml.YAMLError as exc:
        if "maximum nesting depth" in str(exc):  # libyaml's own bound
            raise RecipeError([Problem(message=_TOO_DEEP, file=file)]) from None
        raise _invalid(exc, file) from None
    finally:
        if loader is not None:
            loader.dispose()


_TOO_DEEP = f"the YAML nests too deeply (more than {MAX_DEPTH} levels are refused)"


def _invalid(error: Any, file: str) -> RecipeError:
    """A YAML error as a recipe problem, at its line and column when it has them."""
    import yaml

    if not isinstance(error, yaml.MarkedYAMLError):
        return RecipeError([Problem(message=f"invalid YAML: {error}", file=file)])
    mark = error.problem_mark or error.context_mark
    line = mark.line + 1 if mark is not None else None
    problem = error.problem or str(error)
    if mark is not None:
        problem += f" (column {mark.column + 1})"
    return RecipeError([Problem(message=f"invalid YAML: {problem}", file=file, line=line)])


_STR = "tag:yaml.org,2002:str"


class _Builder:
    """Builds a document's data node by node, recording lines and counting what aliases add."""

    def __init__(self, loader: Any, lines: dict[Path_, int]) -> None:
        import yaml

        self.loader = loader
        self.lines = lines
        self.built: set[int] = set()
        """The nodes built once: seeing one again is an alias being expanded."""
        self.expanded = 0
        self._scalar, self._mapping = yaml.ScalarNode, yaml.MappingNode

    def build(self, node: Any, path: Path_, *, expanded: bool) -> Any:
        """The data of `node` at `path`; `expanded` when it is reached through an alias."""
        line = node.start_mark.line + 1
        if id(node) in self.built:
            expanded = True
        else:
            self.built.add(id(node))
        if expanded:
            # Only the copies count: the work a load does stays within the text's size plus
            # this bound, however the aliases nest.
            self.expanded += 1
            if self.expanded > MAX_EXPANDED:
                raise _Refused(
                    f"the YAML's aliases add more than {MAX_EXPANDED:,} values once they are "
                    "expanded (an alias bomb?); refused",
                    line,
                )
        if len(path) > MAX_DEPTH:
            raise _Refused(f"the YAML nests deeper than {MAX_DEPTH} levels; refused", line)
        self.lines.setdefault(path, line)
        kind = type(node)
        if kind is self._scalar:
            # Most values are text: the constructor would hand back the node's value.
            return node.value if node.tag == _STR else self.loader.construct_object(node)
        if kind is self._mapping:
            _check_duplicate_keys(node)
            self.loader.flatten_mapping(node)
            result: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = self._key(key_node, path, expanded=expanded)
                self.lines[(*path, key)] = key_node.start_mark.line + 1
                result[key] = self.build(value_node, (*path, key), expanded=expanded)
            return result
        items = enumerate(node.value)
        return [self.build(item, (*path, i), expanded=expanded) for i, item in items]

    def _key(self, node: Any, path: Path_, *, expanded: bool) -> Any:
        """A mapping's key: a scalar as it is, a collection as text (built, and counted, like
        any value: a key can hold a bomb too)."""
        if type(node) is self._scalar:
            return node.value if node.tag == _STR else self.loader.construct_object(node)
        lines, self.lines = self.lines, {}  # A key's inside has no line of its own to keep.
        try:
            return str(self.build(node, path, expanded=expanded))
        finally:
            self.lines = lines


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
