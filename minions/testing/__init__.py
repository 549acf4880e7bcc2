"""Test doubles, so agents can be tested offline: scripted and function models.

Use them in your own tests::

    from minions.testing import ScriptedModel

    model = ScriptedModel([[("add", {"a": 2, "b": 3})], "The sum is 5."])
"""

from minions.testing.scripted import FunctionModel, Reply, ScriptedModel, estimate_tokens

__all__ = ["FunctionModel", "Reply", "ScriptedModel", "estimate_tokens"]
