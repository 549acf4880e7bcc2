"""A `StepGraph` as a Mermaid flowchart."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minions._agent.graph import StepGraph

__all__ = []


def to_mermaid(graph: StepGraph) -> str:
    """The graph as a Mermaid flowchart.

    Solid arrows are dependencies; dotted arrows are transitions, labelled with their
    condition (loops back are marked ``loop``). Steps show their mode when it is not
    ``async``, and ``optional`` when they are.
    """
    lines = ["flowchart TD"]
    node = {s: _mermaid_id(s) for s in graph.steps}
    for step_id, step in graph.steps.items():
        notes: list[str] = [step.mode] if step.mode != "async" else []
        if step.optional:
            notes.append("optional")
        label = _mermaid_text(step_id + "".join(f"<br/><i>{n}</i>" for n in notes))
        opening, closing = _SHAPES[step.mode]
        lines.append(f'    {node[step_id]}{opening}"{label}"{closing}')
    for step_id in graph.steps:
        for dependency in graph.dependencies[step_id]:
            lines.append(f"    {node[dependency]} --> {node[step_id]}")
    for transition in graph.transitions:
        text = transition.condition_text or transition.description
        if (transition.source, transition.target) in graph.loops:
            text = f"loop: {text}" if text else "loop"
        label = f'|"{_mermaid_text(text)}"|' if text else ""
        lines.append(f"    {node[transition.source]} -.->{label} {node[transition.target]}")
    for mode, style in _STYLES.items():
        members = [node[s] for s, step in graph.steps.items() if step.mode == mode]
        if members:
            lines.append(f"    classDef {mode.replace('_', '')} {style}")
            lines.append(f"    class {','.join(members)} {mode.replace('_', '')}")
    return "\n".join(lines) + "\n"


_SHAPES = {"async": ("[", "]"), "sync": ("[[", "]]"), "fire_and_forget": (">", "]")}
_STYLES = {"sync": "stroke-width:3px", "fire_and_forget": "stroke-dasharray:4 3"}
_MERMAID_WORDS = {"end", "graph", "subgraph", "flowchart", "style", "class", "classdef", "click"}


def _mermaid_id(step_id: str) -> str:
    return f"{step_id}_" if step_id.lower() in _MERMAID_WORDS else step_id


def _mermaid_text(text: str) -> str:
    return text.replace('"', "#quot;").replace("|", "#124;")
