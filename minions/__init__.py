"""minions: run LLM agents as steps.

The public API is what this module exports; submodules `minions.events`, `minions.testing`,
`minions.models` and `minions.errors` are public too. Everything else may change.
"""

from minions._version import __version__
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
from minions.recipes.errors import InputError, RecipeError
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
from minions.step.kinds import AnalysisStep, LoopStep, ToolStep
from minions.step.model_call import ModelCallExecutor
from minions.step.step import DefaultStep, Step, StepInput
from minions.tools import Tool, ToolRegistry, tool
from minions.tools.executor import ToolCallExecutor

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
