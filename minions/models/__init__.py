"""Models: the `Model` interface, the OpenAI-compatible provider, model strings, record/replay,
and `FallbackModel` (the next model when one is down).

`OpenAIChatModel` is loaded on first use, so `import minions` never pays for the `openai`
package (``from minions.models import OpenAIChatModel``, or `infer_model` with a model string).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minions._lazy import lazy_names
from minions._messages import OutputMode
from minions._values import ModeDemotion
from minions.models._base import Model, TokenCallback
from minions.models._fallback import FallbackModel
from minions.models._infer import MODEL_ENV, infer_model

# Loaded on first use of one of their names: `OpenAIChatModel` so that `import minions` never
# loads `openai`; record/replay (hashlib, pathlib) and the structured-output ladder because a
# run on a model of its own needs neither.
_LAZY: dict[str, str] = {
    "OpenAIChatModel": "minions.models._openai",
    "Recording": "minions.models._recording",
    "RecordingModel": "minions.models._recording",
    "ReplayMissError": "minions.models._recording",
    "ReplayModel": "minions.models._recording",
    "CapabilityMemory": "minions.models._structured",
    "Evidence": "minions.models._structured",
    # Limits (pydantic models): loaded when limits are used.
    "EndpointLimit": "minions.models._limits",
    "EndpointLimiter": "minions.models._limits",
    "ProjectLimit": "minions.models._limits",
    "EndpointPermit": "minions.models._limits",
    "EndpointWait": "minions.models._limits",
    "Limits": "minions.models._limits",
    "LocalLimiter": "minions.models._limits",
}

if TYPE_CHECKING:
    from minions.models._limits import (
        EndpointLimit,
        EndpointLimiter,
        EndpointPermit,
        EndpointWait,
        Limits,
        LocalLimiter,
        ProjectLimit,
    )
    from minions.models._openai import OpenAIChatModel
    from minions.models._recording import Recording, RecordingModel, ReplayMissError, ReplayModel
    from minions.models._structured import CapabilityMemory, Evidence


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())


__all__ = [
    "MODEL_ENV",
    "CapabilityMemory",
    "EndpointLimit",
    "EndpointLimiter",
    "ProjectLimit",
    "EndpointPermit",
    "EndpointWait",
    "Evidence",
    "FallbackModel",
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
