"""A stand-in for a language model, used to make this example's recording offline.

No model runs on the machine that builds minions, so the recording beside the recipe was
made by this function (``python examples/record.py examples/research_assistant``): it
extracts sentences with figures from each document, assembles the report from the extracted
facts, and checks it, each from what the prompt shows. Record a real run with
``minions run recipe.yaml --model ollama:llama3.2:3b --record recipe.recording.json``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from minions import Prompt


def _data(prompt: Prompt) -> Any:
    found = re.search(r"The data:\n```(json)?\n(.*?)\n```", prompt.messages[-1].content, re.S)
    if found is None:
        return None
    return json.loads(found.group(2)) if found.group(1) else found.group(2)


def _results(prompt: Prompt) -> dict[str, Any]:
    """The outputs of earlier steps, which the prompt lists as ``[step id]`` then JSON."""
    text = prompt.messages[-1].content
    found = {}
    pattern = r"^\[(\w+)\]\n(.*?)(?=^\[\w+\]\n|^Task:|\Z)"
    for step_id, body in re.findall(pattern, text, re.S | re.M):
        try:
            found[step_id] = json.loads(body)
        except ValueError:
            found[step_id] = body.strip()
    return found


def _facts(document: str) -> dict[str, Any]:
    source = re.search(r"^Source: ([^;(.]+)", document, re.M)
    year = re.search(r"^Source: .*?\((\d{4})\)", document, re.M)
    cite = "unknown"
    if source:
        words = source.group(1).split()
        name = [words[0], *(w for w in words[1:4] if w[:1].isupper())]
        cite = " ".join(name) + (f", {year.group(1)}" if year else "")
    body = " ".join(
        line for line in document.splitlines() if line and not line.startswith(("#", "Source:"))
    )
    sentences = re.split(r"(?<=[.!?])\s+", body)
    facts = [s for s in sentences if re.search(r"\d", s)][:3] or sentences[:2]
    return {"facts": facts, "source": cite}


def reply(prompt: Prompt) -> str:
    step = prompt.step_id
    if step.startswith("facts_"):
        return json.dumps(_facts(str(_data(prompt))))
    if step == "synthesis":
        results = _results(prompt)
        points, sources = [], []
        for name in ("facts_pollination", "facts_decline", "facts_solutions"):
            found = results.get(name) or {}
            source = found.get("source", "unknown")
            sources.append(source)
            points.extend(f"{fact} [{source}]" for fact in found.get("facts", [])[:2])
        report = {
            "title": "Bees: why they matter, why they decline, what helps",
            "summary": "Bees pollinate most leading food crops; habitat loss, pesticides, "
            "parasites and climate change drive their decline; habitat and farming changes help.",
            "key_points": points,
            "sources": sources,
        }
        return json.dumps(report)
    if step == "quality":
        report = _data(prompt) or {}
        score = 4 if len(report.get("key_points", [])) >= 5 else 3
        return json.dumps({"score": score, "missing": ["regional differences"]})
    if step == "citations":
        report = _data(prompt) or {}
        sources = report.get("sources", [])
        uncited = [
            p for p in report.get("key_points", []) if not any(f"[{s}]" in p for s in sources)
        ]
        return json.dumps({"all_cited": not uncited, "uncited": uncited})
    if step == "answer":
        results = _results(prompt)
        report = results.get("synthesis") or {}
        quality = results.get("quality") or {}
        gaps = ", ".join(quality.get("missing", [])) or "nothing"
        return (
            f"{report.get('summary', '')} The report cites {', '.join(report.get('sources', []))}. "
            f"The quality check rated it {quality.get('score', '?')} of 5 and noted it does not "
            f"cover {gaps}."
        )
    raise ValueError(f"the stand-in has no reply for step {step!r}")
