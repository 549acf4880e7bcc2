"""The type variables of minions' generic values (`StepExecution[T]`, `DefaultStep[T]`,
`ToolContext[D]`...), each defaulting to `Any`: a bare `StepExecution` is a
`StepExecution[Any]`, so code that names no type keeps type-checking under ``--strict``.

Type checkers see `typing_extensions.TypeVar` with its default; at run time the plain
`typing.TypeVar` does (Python 3.11 has no defaults), so importing minions does not import
`typing_extensions`.

Steps are covariant in their output (`OutputT_co`): a list of a `DefaultStep[Expense]` and a
`DefaultStep[str]` is a list of steps, as a recipe takes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import TypeVar

    OutputT = TypeVar("OutputT", default=Any)
    OutputT_co = TypeVar("OutputT_co", covariant=True, default=Any)
    DepsT = TypeVar("DepsT", default=Any)
else:
    from typing import TypeVar

    OutputT = TypeVar("OutputT")
    OutputT_co = TypeVar("OutputT_co", covariant=True)
    DepsT = TypeVar("DepsT")

__all__: list[str] = []
