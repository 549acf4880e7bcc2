"""What the other layers of minions take from `minions.models` and users do not: the one
module of this package they may import besides `minions.models` itself.

Not public: any of it may change in any release. Who takes what, and why, is the table
"What a package takes from a neighbour's private module" of docs/architecture.md, which
``tests/test_architecture.py`` holds to the code. Each name loads its module on first use,
as a direct import of it would (the step loop must not load the limits' pydantic models).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minions._lazy import lazy_names

_NAMES: dict[str, str] = {
    # The switch of `minions.testing.block_real_models()`: the test doubles set it, the step
    # loop checks it before a call to a model with an endpoint.
    "BLOCK": "minions.models._blocking",
    "ModelBlock": "minions.models._blocking",
    "check_model": "minions.models._blocking",
    "model_block": "minions.models._blocking",
    "serving_tests": "minions.models._blocking",
    # The run whose model calls teach the structured-output ladder (the step loop sets it).
    "LEARNING_RUN": "minions.models._learning",
    # `FallbackModel` without `ABCMeta`'s `isinstance` (the step loop asks on every call).
    "is_fallback": "minions.models._fallback",
    # A model's answer as JSON data: a recording's, and a parked call's state.
    "decode_response": "minions.models._recording",
    "encode_response": "minions.models._recording",
    # The pieces of an `EndpointLimiter`, for the run store's limiter over every worker.
    "DEFAULT_CAPABILITY_EXPIRY": "minions.models._limits",
    "DEFAULT_DEMOTE_RUNS": "minions.models._limits",
    "LineOfTurns": "minions.models._limits",
    "OnWait": "minions.models._limits",
    "Sleep": "minions.models._limits",
    "WINDOW": "minions.models._limits",
    "base_url": "minions.models._limits",
    "blocked": "minions.models._limits",
    "estimate_prompt": "minions.models._limits",
    "wait_for_change": "minions.models._limits",
    # The grammar of model strings.
    "PROVIDERS": "minions.models._infer",
    "model_endpoint": "minions.models._infer",
    "model_string_problem": "minions.models._infer",
}

if TYPE_CHECKING:
    from minions.models._blocking import BLOCK as BLOCK
    from minions.models._blocking import ModelBlock as ModelBlock
    from minions.models._blocking import check_model as check_model
    from minions.models._blocking import model_block as model_block
    from minions.models._blocking import serving_tests as serving_tests
    from minions.models._fallback import is_fallback as is_fallback
    from minions.models._infer import PROVIDERS as PROVIDERS
    from minions.models._infer import model_endpoint as model_endpoint
    from minions.models._infer import model_string_problem as model_string_problem
    from minions.models._learning import LEARNING_RUN as LEARNING_RUN
    from minions.models._limits import DEFAULT_CAPABILITY_EXPIRY as DEFAULT_CAPABILITY_EXPIRY
    from minions.models._limits import DEFAULT_DEMOTE_RUNS as DEFAULT_DEMOTE_RUNS
    from minions.models._limits import WINDOW as WINDOW
    from minions.models._limits import LineOfTurns as LineOfTurns
    from minions.models._limits import OnWait as OnWait
    from minions.models._limits import Sleep as Sleep
    from minions.models._limits import base_url as base_url
    from minions.models._limits import blocked as blocked
    from minions.models._limits import estimate_prompt as estimate_prompt
    from minions.models._limits import wait_for_change as wait_for_change
    from minions.models._recording import decode_response as decode_response
    from minions.models._recording import encode_response as encode_response


__getattr__, __dir__ = lazy_names(__name__, _NAMES, globals())
