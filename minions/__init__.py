"""minions: run LLM agents as steps.

The public API is what this module exports, and the public subpackages: `minions.events` (the
typed events of a run), `minions.errors`, `minions.models` (providers, model strings,
record/replay), `minions.tools` (tools and the built-in ones), `minions.recipes` (recipes and
their YAML form) and `minions.testing` (test doubles). Modules and packages whose names start
with ``_`` are private and may change at any time.
"""

from typing import TYPE_CHECKING

from minions._config import ExecutionConfig
from minions._lazy import lazy_names
from minions._memory import InMemoryModelMemory, MemorySnapshot, ModelMemory
from minions._messages import (
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
from minions._output import OutputInstructions
from minions._step.agent import DefaultStep
from minions._step.cache import CachedStep, CachePolicy, InMemoryStepCache, StepCache
from minions._step.completion import (
    CallLimitLink,
    CompletionDecision,
    CompletionMarkerLink,
    CompletionToolLink,
    StepCompletionChain,
    StepCompletionLink,
    StructuredOutputLink,
    TextAnswerLink,
)
from minions._step.context import AgentContext
from minions._step.execution import DecisionRecord, StepExecution, StepStatus
from minions._step.executor import StepExecutor
from minions._step.model_call import ModelCallExecutor
from minions._step.result import AgentResult
from minions._step.run import StepRun
from minions._step.settings import RunSettings
from minions._step.step import MemoryScope, Step, StepInput, StepMode
from minions._step.tool_call import ToolCallExecutor
from minions._version import __version__
from minions.errors import (
    ApprovalRequiredError,
    BudgetExceededError,
    ConfigError,
    DiffTooLargeError,
    IdempotencyConflictError,
    InputError,
    KeyExistsError,
    MCPServerError,
    MinionsError,
    MissingDepsError,
    MissingExtraError,
    ModelError,
    ModelOutputError,
    OutputValidationError,
    PlanError,
    Problem,
    Reask,
    RecipeError,
    RecordingError,
    RerunError,
    RunStateError,
    ScheduleExistsError,
    ScriptExhaustedError,
    StepDefinitionError,
    StepFailed,
    StoreError,
    StreamingWarning,
    TemplateError,
    TemplateSyntaxError,
    ToolDefinitionError,
    ToolError,
    TransientModelError,
    UnknownKeyError,
    UnknownLinkError,
    UnknownProjectError,
    UnknownRecipeError,
    UnknownRunError,
    UnknownScheduleError,
    UnknownStepError,
)
from minions.models import Model
from minions.tools import Tool, ToolContext, ToolRegistry, tool

# The agent layer, routing, step kinds and recipes load on first use of one of their names:
# `import minions` stays light for code that only runs steps (most of its cost is building
# classes; see `benchmarks/import_time.py`), and `load_recipe` needs pydantic and PyYAML.
_LAZY: dict[str, str] = {
    "StepStream": "minions._step.stream",
    "AgentExecutor": "minions._agent.executor",
    "RunStream": "minions._agent.stream",
    "StepGraph": "minions._agent.graph",
    "StepManager": "minions._agent.manager",
    "AgentRecipe": "minions.recipes._recipe",
    "RecipeStep": "minions.recipes._subrecipe",
    "load_recipe": "minions.recipes._build",
    "recipe_problems": "minions.recipes._validation",
    "Condition": "minions._routing.transition",
    "Transition": "minions._routing.transition",
    "ConditionLink": "minions._routing.selection",
    "FirstCandidateLink": "minions._routing.selection",
    "ModelChoiceLink": "minions._routing.selection",
    "Routing": "minions._routing.selection",
    "SelectionDecision": "minions._routing.selection",
    "SelectionRequest": "minions._routing.selection",
    "SingleCandidateLink": "minions._routing.selection",
    "StepSelectionChain": "minions._routing.selection",
    "StepSelectionLink": "minions._routing.selection",
    "StepSuggestionLink": "minions._routing.selection",
    "AnalysisStep": "minions._kinds.analysis",
    "LoopStep": "minions._kinds.loop",
    "ToolStep": "minions._kinds.tool",
    "TaskStep": "minions._kinds.task",
    "Plan": "minions._plan.plan",
    "PlanStep": "minions._plan.plan",
    "TokenLine": "minions._plan.plan",
    "PlanGenerator": "minions._plan.generator",
    "PlanResult": "minions._plan.result",
}

if TYPE_CHECKING:
    from minions._agent.executor import AgentExecutor
    from minions._agent.graph import StepGraph
    from minions._agent.manager import StepManager
    from minions._agent.stream import RunStream
    from minions._kinds.analysis import AnalysisStep
    from minions._kinds.loop import LoopStep
    from minions._kinds.task import TaskStep
    from minions._kinds.tool import ToolStep
    from minions._plan.generator import PlanGenerator
    from minions._plan.plan import Plan, PlanStep, TokenLine
    from minions._plan.result import PlanResult
    from minions._routing.selection import (
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
    from minions._routing.transition import Condition, Transition
    from minions._step.stream import StepStream
    from minions.recipes import AgentRecipe, RecipeStep, load_recipe, recipe_problems


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())


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
    "ToolContext",
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
    "RunSettings",
    "CachePolicy",
    "CachedStep",
    "InMemoryStepCache",
    "StepCache",
    "Step",
    "StepExecution",
    "StepExecutor",
    "StepInput",
    "StepStream",
    "StepRun",
    "StepStatus",
    "StepMode",
    "MemoryScope",
    # step kinds
    "AnalysisStep",
    "LoopStep",
    "RecipeStep",
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
    "Condition",
    "RunStream",
    "StepGraph",
    "StepManager",
    "Transition",
    "load_recipe",
    "recipe_problems",
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
    # plans from requirements
    "Plan",
    "PlanGenerator",
    "PlanResult",
    "PlanStep",
    "TaskStep",
    "TokenLine",
    # errors
    "ApprovalRequiredError",
    "MCPServerError",
    "BudgetExceededError",
    "ConfigError",
    "DiffTooLargeError",
    "MinionsError",
    "MissingDepsError",
    "MissingExtraError",
    "ModelError",
    "ModelOutputError",
    "OutputValidationError",
    "IdempotencyConflictError",
    "InputError",
    "KeyExistsError",
    "PlanError",
    "Problem",
    "Reask",
    "RecipeError",
    "RecordingError",
    "RerunError",
    "RunStateError",
    "ScheduleExistsError",
    "StepDefinitionError",
    "StepFailed",
    "StoreError",
    "StreamingWarning",
    "TemplateError",
    "TemplateSyntaxError",
    "ToolDefinitionError",
    "ToolError",
    "TransientModelError",
    "ScriptExhaustedError",
    "UnknownKeyError",
    "UnknownProjectError",
    "UnknownLinkError",
    "UnknownRecipeError",
    "UnknownRunError",
    "UnknownScheduleError",
    "UnknownStepError",
]
