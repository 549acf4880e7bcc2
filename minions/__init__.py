"""minions: run LLM agents as steps.

The public API is what this module exports; submodules `minions.events`, `minions.testing`,
`minions.models` and `minions.errors` are public too. Everything else may change.
"""

import importlib
from typing import TYPE_CHECKING, Any

from minions._version import __version__
from minions.config import ExecutionConfig
from minions.context import AgentContext
from minions.errors import (
    BudgetExceededError,
    MinionsError,
    ModelError,
    ModelOutputError,
    OutputValidationError,
    StepDefinitionError,
    TemplateError,
    TemplateSyntaxError,
    ToolDefinitionError,
    ToolError,
    TransientModelError,
    UnknownRecipeError,
)
from minions.memory import InMemoryModelMemory, MemorySnapshot, ModelMemory
from minions.messages import (
    Message,
    MessageBundle,
    ModelCall,
    ModelCallResponse,
    Prompt,
    ToolCall,
    ToolCallResponse,
    ToolSpec,
    Usage,
)
from minions.models.base import Model
from minions.output import OutputInstructions
from minions.step.completion import (
    CallLimitLink,
    CompletionDecision,
    CompletionMarkerLink,
    CompletionToolLink,
    StepCompletionChain,
    StepCompletionLink,
    StructuredOutputLink,
    TextAnswerLink,
)
from minions.step.execution import DecisionRecord, StepExecution, StepStatus
from minions.step.executor import StepExecutor
from minions.step.model_call import ModelCallExecutor
from minions.step.step import DefaultStep, Step, StepInput
from minions.tools import Tool, ToolRegistry, tool
from minions.tools.executor import ToolCallExecutor

# The agent layer, step kinds and recipe errors load on first use: `import minions` stays light
# for code that only runs steps (see `benchmarks/import_time.py`).
_LAZY: dict[str, str] = {
    "AgentExecutor": "minions.agent",
    "AgentRecipe": "minions.agent",
    "AgentResult": "minions.agent",
    "ConditionLink": "minions.agent",
    "FirstCandidateLink": "minions.agent",
    "ModelChoiceLink": "minions.agent",
    "Routing": "minions.agent",
    "RunStream": "minions.agent",
    "SelectionDecision": "minions.agent",
    "SelectionRequest": "minions.agent",
    "SingleCandidateLink": "minions.agent",
    "StepGraph": "minions.agent",
    "StepManager": "minions.agent",
    "StepSelectionChain": "minions.agent",
    "StepSelectionLink": "minions.agent",
    "StepSuggestionLink": "minions.agent",
    "Transition": "minions.agent",
    "AnalysisStep": "minions.step.kinds",
    "LoopStep": "minions.step.kinds",
    "ToolStep": "minions.step.kinds",
    "InputError": "minions.recipes.errors",
    "RecipeError": "minions.recipes.errors",
}

if TYPE_CHECKING:
    from minions.agent import (
        AgentExecutor,
        AgentRecipe,
        AgentResult,
        ConditionLink,
        FirstCandidateLink,
        ModelChoiceLink,
        Routing,
        RunStream,
        SelectionDecision,
        SelectionRequest,
        SingleCandidateLink,
        StepGraph,
        StepManager,
        StepSelectionChain,
        StepSelectionLink,
        StepSuggestionLink,
        Transition,
    )
    from minions.recipes.errors import InputError, RecipeError
    from minions.step.kinds import AnalysisStep, LoopStep, ToolStep


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'minions' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "__version__",
    # messages and values
    "Message",
    "MessageBundle",
    "ModelCall",
    "ModelCallResponse",
    "Prompt",
    "ToolCall",
    "ToolCallResponse",
    "ToolSpec",
    "Usage",
    # memory
    "InMemoryModelMemory",
    "MemorySnapshot",
    "ModelMemory",
    # tools
    "Tool",
    "ToolCallExecutor",
    "ToolRegistry",
    "tool",
    # models
    "Model",
    "ModelCallExecutor",
    # steps
    "AgentContext",
    "DefaultStep",
    "DecisionRecord",
    "ExecutionConfig",
    "OutputInstructions",
    "Step",
    "StepExecution",
    "StepExecutor",
    "StepInput",
    "StepStatus",
    "AnalysisStep",
    "LoopStep",
    "ToolStep",
    # completion chain
    "CallLimitLink",
    "CompletionDecision",
    "CompletionMarkerLink",
    "CompletionToolLink",
    "StepCompletionChain",
    "StepCompletionLink",
    "StructuredOutputLink",
    "TextAnswerLink",
    # agents: recipes, graph, scheduling, routing
    "AgentExecutor",
    "AgentRecipe",
    "AgentResult",
    "RunStream",
    "StepGraph",
    "StepManager",
    "Transition",
    # next-step selection chain
    "ConditionLink",
    "FirstCandidateLink",
    "ModelChoiceLink",
    "Routing",
    "SelectionDecision",
    "SelectionRequest",
    "SingleCandidateLink",
    "StepSelectionChain",
    "StepSelectionLink",
    "StepSuggestionLink",
    # errors
    "BudgetExceededError",
    "MinionsError",
    "ModelError",
    "ModelOutputError",
    "OutputValidationError",
    "InputError",
    "RecipeError",
    "StepDefinitionError",
    "TemplateError",
    "TemplateSyntaxError",
    "ToolDefinitionError",
    "ToolError",
    "TransientModelError",
    "UnknownRecipeError",
]
