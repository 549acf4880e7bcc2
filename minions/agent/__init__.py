"""The agent layer: recipes of steps, their graph, the run's bookkeeping and its scheduler.

* `AgentRecipe`, `Transition` (recipe.py): an agent as data.
* `StepGraph` (graph.py): a recipe checked, with its edges; Mermaid export.
* `StepManager` (manager.py): ready, running, done and skipped steps; advancing a run.
* `StepSelectionChain` and its links (selection.py): which step runs next.
* `AgentExecutor` (executor.py): runs a recipe, returns an `AgentResult` (result.py) or
  streams its events.
"""

from minions.agent.executor import AgentExecutor, RunStream
from minions.agent.graph import StepGraph
from minions.agent.manager import StepManager
from minions.agent.recipe import AgentRecipe, Condition, Transition
from minions.agent.result import AgentResult
from minions.agent.selection import (
    ConditionLink,
    FirstCandidateLink,
    ModelChoiceLink,
    Routing,
    SelectionDecision,
    SelectionRequest,
    SingleCandidateLink,
    StepSelectionChain,
    StepSelectionLink,
    StepSuggestionLink,
)

__all__ = [
    "AgentExecutor",
    "AgentRecipe",
    "AgentResult",
    "Condition",
    "ConditionLink",
    "FirstCandidateLink",
    "ModelChoiceLink",
    "Routing",
    "RunStream",
    "SelectionDecision",
    "SelectionRequest",
    "SingleCandidateLink",
    "StepGraph",
    "StepManager",
    "StepSelectionChain",
    "StepSelectionLink",
    "StepSuggestionLink",
    "Transition",
]
