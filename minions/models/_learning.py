"""Which run the model calls of this task belong to, as what endpoints teach sees it (its own
module: the step loop sets it on every call, and must not load the structured-output code to
do so)."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Final

__all__: list[str] = []

LEARNING_RUN: Final[ContextVar[str | None]] = ContextVar("minions_learning_run", default=None)
"""The run whose model calls are learning now (the step loop sets it): the answers of one run
that ignore an output mode demote it for that run only, until `CapabilityMemory.demote_runs`
runs agree."""
