"""Test doubles, so agents can be tested offline: a model that needs no script, scripted and
function models, a local OpenAI-compatible HTTP server, and a switch that forbids real model
requests (`block_real_models`, also a pytest fixture).

Use them in your own tests::

    from minions.testing import FakeOpenAIServer, ScriptedModel

    model = ScriptedModel([[("add", {"a": 2, "b": 3})], "The sum is 5."])

    with FakeOpenAIServer(["The sum is 5."]) as server:
        model = server.model()
"""

from minions._text import estimate_tokens
from minions.testing._block import ModelBlock, block_real_models
from minions.testing._fake_openai import (
    FakeOpenAIServer,
    FakeReply,
    FakeRequest,
    FakeScript,
    Quirk,
)
from minions.testing._scripted import FunctionModel, Reply, ScriptedModel
from minions.testing._test_model import TestModel

__all__ = [
    "FakeOpenAIServer",
    "FakeReply",
    "FakeRequest",
    "FakeScript",
    "FunctionModel",
    "ModelBlock",
    "Quirk",
    "Reply",
    "ScriptedModel",
    "TestModel",
    "block_real_models",
    "estimate_tokens",
]
