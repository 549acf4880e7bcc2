"""Models: the `Model` interface, the OpenAI-compatible provider, model strings, record/replay.

`OpenAIChatModel` is loaded on first use, so `import minions` never pays for the `openai`
package (``from minions.models import OpenAIChatModel``, or `infer_model` with a model string).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from minions._values import ModeDemotion
from minions.models._base import Model, TokenCallback
from minions.models._infer import MODEL_ENV, infer_model
from minions.models._recording import Recording, RecordingModel, ReplayMissError, ReplayModel
from minions.models._structured import CapabilityMemory, OutputMode

if TYPE_CHECKING:
    from minions.models._limits import (
        EndpointLimit,
        EndpointLimiter,
        EndpointPermit,
        EndpointWait,
        Limits,
        LocalLimiter,
    )
    from minions.models._openai import OpenAIChatModel

_LIMITS = (
    "EndpointLimit",
    "EndpointLimiter",
    "EndpointPermit",
    "EndpointWait",
    "Limits",
    "LocalLimiter",
)


def __getattr__(name: str) -> Any:
    # `OpenAIChatModel` is importable from here without `import minions` loading `openai`.
    if name == "OpenAIChatModel":
        from minions.models._openai import OpenAIChatModel

        globals()[name] = OpenAIChatModel
        return OpenAIChatModel
    if name in _LIMITS:  # pydantic models: loaded when limits are used
        from minions.models import _limits

        value = getattr(_limits, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MODEL_ENV",
    "CapabilityMemory",
    "EndpointLimit",
    "EndpointLimiter",
    "EndpointPermit",
    "EndpointWait",
    "Limits",
    "LocalLimiter",
    "ModeDemotion",
    "Model",
    "OpenAIChatModel",
    "OutputMode",
    "Recording",
    "RecordingModel",
    "ReplayMissError",
    "ReplayModel",
    "TokenCallback",
    "infer_model",
]
