"""A step graph as a Mermaid flowchart."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from minions._routing.transition import Transition
from minions._step.step import Step

__all__: list[str] = []


def to_mermaid(
    steps: Mapping[str, Step],
    dependencies: Mapping[str, Sequence[str]],
    transitions: Sequence[Transition],
    loops: Collection[tuple[str, str]],
) -> str:
    """The graph of `steps` as a Mermaid flowchart.

    Solid arrows are dependencies; dotted arrows are transitions, labelled with their
    condition (loops back are marked ``loop``). Steps show their mode when it is not
    ``async``, and ``optional`` when they are.
    """
    lines = ["flowchart TD"]
    node = {s: _mermaid_id(s) for s in steps}
    for step_id, step in steps.items():
        notes: list[str] = [step.mode] if step.mode != "async" else []
        if step.optional:
            notes.append("optional")
        label = _mermaid_text(step_id + "".join(f"<br/><i>{n}</i>" for n in notes))
        opening, closing = _SHAPES[step.mode]
        lines.append(f'    {node[step_id]}{opening}"{label}"{closing}')
    for step_id in steps:
        for dependency in dependencies[step_id]:
            lines.append(f"    {node[dependency]} --> {node[step_id]}")
    for transition in transitions:
        text = transition.condition_text or transition.description
        if (transition.source, transition.target) in loops:
            text = f"loop: {text}" if text else "loop"
        label = f'|"{_mermaid_text(text)}"|' if text else ""
        lines.append(f"    {node[transition.source]} -.->{label} {node[transition.target]}")
    for mode, style in _STYLES.items():
        members = [node[s] for s, step in steps.items() if step.mode == mode]
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
