"""Stand-ins for a language model and a judge, used to make this example's recordings offline.

No model runs on the machine that builds minions, so the recordings beside the dataset were
made by these functions (``python examples/evals/record.py``): the agent calls the tool, then
answers with its result, except that every second answer about Peru comes with a sentence
around it (a flaky case, as real models have); the judge passes an answer that is one word.
Record a real model with ``minions eval capitals.eval.yaml --model MODEL --judge-model MODEL
--record recordings``.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

from minions import Prompt

_peru = itertools.count(1)


def reply(prompt: Prompt) -> Any:
    """The agent: a tool call first, then the answer from the tool's result."""
    last = prompt.messages[-1]
    if last.role != "tool":
        country = re.search(r"capital of (\w+)\?", last.content)
        name = country.group(1) if country else "?"
        return [("lookup_capital", {"country": name})]
    city = last.content.strip().strip('"')
    if city == "Lima" and next(_peru) % 2 == 0:
        return f"The capital of Peru is {city}."
    return city


def judge(prompt: Prompt) -> str:
    """The judge: an answer of one word passes."""
    found = re.search(r"<output>\n(.*?)\n</output>", prompt.messages[-1].content, re.S)
    words = (found.group(1) if found else "").split()
    if len(words) == 1:
        return json.dumps({"passed": True, "reason": f"names {words[0]} and nothing else"})
    return json.dumps({"passed": False, "reason": "says more than the capital"})
