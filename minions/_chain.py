"""What every chain of responsibility in minions shares: named links in an immutable order.

`StepCompletionChain` (is a step done?) and `StepSelectionChain` (which step runs next?) are
both a tuple of links walked in order, edited by returning new chains. This module holds the
editing; each chain adds its own walk.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Iterable
from typing import Any, ClassVar, Generic, Self, TypeVar, cast

from minions.errors import UnknownLinkError

__all__ = []


class NamedLink:
    """A link with a `name` that identifies it in its chain, in events and in records.

    Subclasses without an explicit `name` get one from their class name: ``TextAnswerLink``
    is ``text_answer``.
    """

    name: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("name"):
            cls.name = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower().removesuffix("_link")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


L = TypeVar("L", bound=NamedLink)
D = TypeVar("D")


async def answer_of(value: D | Awaitable[D | None] | None, kind: type[D]) -> D | None:
    """A link's answer, awaited when the link is async (checked cheaply: links are on the
    step loop's path)."""
    if value is None or isinstance(value, kind):
        return value
    return await cast("Awaitable[D | None]", value)


class LinkChain(Generic[L]):
    """An ordered, immutable tuple of links. Editing methods return a new chain of the same
    class, so a shared chain (such as a default) never changes behind anyone's back.

    A link is referred to by its `name` or by its class.
    """

    __slots__ = ("links",)
    kind: ClassVar[str] = "link"
    """What a link is called in error messages (``completion link``...)."""

    def __init__(self, links: Iterable[L] = ()) -> None:
        self.links: tuple[L, ...] = tuple(links)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(link.name for link in self.links)

    def _index(self, ref: str | type[L]) -> int:
        for i, link in enumerate(self.links):
            if (isinstance(ref, str) and link.name == ref) or (
                isinstance(ref, type) and isinstance(link, ref)
            ):
                return i
        name = ref if isinstance(ref, str) else ref.__name__
        raise UnknownLinkError(
            f"no {self.kind} {name!r} in the chain (links: {', '.join(self.names) or 'none'})"
        )

    def add_first(self, link: L) -> Self:
        return type(self)((link, *self.links))

    def add_last(self, link: L) -> Self:
        return type(self)((*self.links, link))

    def add_before(self, ref: str | type[L], link: L) -> Self:
        i = self._index(ref)
        return type(self)((*self.links[:i], link, *self.links[i:]))

    def add_after(self, ref: str | type[L], link: L) -> Self:
        i = self._index(ref) + 1
        return type(self)((*self.links[:i], link, *self.links[i:]))

    def remove(self, ref: str | type[L]) -> Self:
        i = self._index(ref)
        return type(self)((*self.links[:i], *self.links[i + 1 :]))

    def replace(self, ref: str | type[L], link: L) -> Self:
        i = self._index(ref)
        return type(self)((*self.links[:i], link, *self.links[i + 1 :]))

    def __len__(self) -> int:
        return len(self.links)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self.names)})"
