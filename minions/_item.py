"""`ItemId`, the id an execution goes by (``step``, ``each[2]``): here on its own, with no
import, so that the step loop names its executions without loading the events' models
(`minions._fold` re-exports it with the names every front end shares)."""

from __future__ import annotations

from dataclasses import dataclass

__all__: list[str] = []


@dataclass(frozen=True, slots=True)
class ItemId:
    """The id an execution goes by in events and records: a step's id, with ``[i]`` for its
    loop item `i` (``each[2]``).

    Attributes:
        step: the step's id.
        item: the loop item's index (``None``: the step itself).
    """

    step: str
    item: int | None = None

    @classmethod
    def parse(cls, text: str) -> ItemId:
        """``"each[2]"`` is `ItemId("each", 2)`; ``"each"`` is `ItemId("each")`."""
        if text.endswith("]"):
            step, bracket, index = text[:-1].rpartition("[")
            if bracket and step and index.isdigit() and index.isascii():
                return cls(step, int(index))
        return cls(text)

    def __str__(self) -> str:
        return self.step if self.item is None else f"{self.step}[{self.item}]"

    @property
    def items_prefix(self) -> str:
        """What the ids of its step's loop items start with (``each[``): built once, an id
        is matched with `str.startswith` (no parse per event)."""
        return f"{self.step}["

    def scope(self, visit: int) -> str:
        """The scope of this execution at `visit`, which its conversation and its calls' ids
        are named by: ``each#1``, or ``each#1[2]`` for a loop item."""
        return f"{self.step}#{visit}" if self.item is None else f"{self.step}#{visit}[{self.item}]"

    @classmethod
    def visit_of(cls, scope: str) -> int | None:
        """The visit a `scope` (`ItemId.scope`: ``each#2``, ``each#2[1]``) names, or
        ``None``: it is no such scope."""
        _, hash_, visit = scope.rpartition("#")
        found = cls.parse(visit)
        if hash_ and found.step.isdigit() and found.step.isascii():
            return int(found.step)
        return None
