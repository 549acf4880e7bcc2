"""Helpers of the eval tests: a small recipe and dataset on disk, and models that answer a
case right on alternate calls."""

from __future__ import annotations

import re
import textwrap
import threading
from collections import Counter
from pathlib import Path

from minions._messages import Prompt
from minions.testing import FakeReply, FakeRequest, FunctionModel

RECIPE = """\
id: capital
inputs:
  country: {type: string}
steps:
  - id: answer
    goal: "What is the capital of {{ inputs.country }}? Answer with the city only."
"""

DATASET = """\
# Capitals: the first dataset.
recipe: capital.yaml
repeat: 4
cases:
  - id: france
    inputs: {country: France}
    expected: Paris
    checks:
      - expr: "contains(output, 'Paris')"
  - id: japan
    inputs: {country: Japan}
    expected: Tokyo
# the end
"""

CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Peru": "Lima"}


def write(folder: Path, dataset: str = DATASET, recipe: str = RECIPE) -> Path:
    """The recipe as capital.yaml and the dataset as capitals.yaml in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "capital.yaml").write_text(recipe)
    path = folder / "capitals.yaml"
    path.write_text(textwrap.dedent(dataset))
    return path


def country(text: str) -> str:
    found = re.search(r"capital of (\w+)", text)
    return found.group(1) if found else ""


class Alternating:
    """Answers each country right, except France: right on its 1st, 3rd... call, wrong on its
    2nd, 4th... (so a case repeated 4 times passes 2). Thread-safe: the fake server answers
    in its own threads."""

    def __init__(self, flaky: tuple[str, ...] = ("France",)) -> None:
        self.flaky = flaky
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def answer(self, text: str) -> str:
        name = country(text)
        with self._lock:
            self.calls[name] += 1
            count = self.calls[name]
        if name in self.flaky and count % 2 == 0:
            return "Lyon"
        return CAPITALS.get(name, "I do not know")

    def reply(self, request: FakeRequest) -> FakeReply:
        """For `FakeOpenAIServer`."""
        return FakeReply.text(self.answer(str(request.last_message.get("content", ""))))

    def model(self) -> FunctionModel:
        """A `FunctionModel` answering the same way."""
        return FunctionModel(lambda prompt: self.answer(_task(prompt)), name="alternating")


def _task(prompt: Prompt) -> str:
    return prompt.messages[-1].content
