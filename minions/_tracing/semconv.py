"""The attribute names and values of the OpenTelemetry GenAI semantic conventions that minions
writes, in one place.

The conventions are still in development and live in their own repository now; the Python
``opentelemetry-semantic-conventions`` package marks several of these names as moved, so they
are spelled out here rather than imported. ``gen_ai.system`` is now ``gen_ai.provider.name``,
and the prompt and completion token counts are ``gen_ai.usage.input_tokens`` and
``gen_ai.usage.output_tokens``.

Names under ``minions.`` are minions' own: run totals go there (not under ``gen_ai.usage``), so
a backend that adds up the model calls' tokens does not count them twice.
"""

from __future__ import annotations

from typing import Final

__all__: list[str] = []  # private: the names are for minions._tracing

# -- gen_ai.*: the conventions' own -----------------------------------------------------------

OPERATION_NAME: Final = "gen_ai.operation.name"
OPERATION_CHAT: Final = "chat"
OPERATION_EXECUTE_TOOL: Final = "execute_tool"
OPERATION_INVOKE_AGENT: Final = "invoke_agent"
OPERATION_INVOKE_WORKFLOW: Final = "invoke_workflow"

PROVIDER_NAME: Final = "gen_ai.provider.name"
"""Was ``gen_ai.system``."""
REQUEST_MODEL: Final = "gen_ai.request.model"
REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
REQUEST_TOP_P: Final = "gen_ai.request.top_p"
REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
REQUEST_SEED: Final = "gen_ai.request.seed"
RESPONSE_MODEL: Final = "gen_ai.response.model"
RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
"""Was ``gen_ai.usage.prompt_tokens``."""
USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
"""Was ``gen_ai.usage.completion_tokens``."""
OUTPUT_TYPE: Final = "gen_ai.output.type"
"""``json`` for structured output (written only when the request asks for a format)."""
AGENT_NAME: Final = "gen_ai.agent.name"
WORKFLOW_NAME: Final = "gen_ai.workflow.name"
"""The workflow's name on ``invoke_workflow`` spans (the recipe id). The conventions' newest
text folds workflows into ``invoke_agent`` spans named by ``gen_ai.agent.name``, which the run's
span carries too."""
CONVERSATION_ID: Final = "gen_ai.conversation.id"
"""On every span of a run: the run id, so a backend groups a run's spans as one conversation."""
RESPONSE_ID: Final = "gen_ai.response.id"

TOOL_NAME: Final = "gen_ai.tool.name"
TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
TOOL_TYPE: Final = "gen_ai.tool.type"

# Content: written only when capture is turned on (opt-in), as JSON in the conventions' shape.
SYSTEM_INSTRUCTIONS: Final = "gen_ai.system_instructions"
INPUT_MESSAGES: Final = "gen_ai.input.messages"
OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
TOOL_DEFINITIONS: Final = "gen_ai.tool.definitions"
"""The tools offered to the model, on ``chat`` spans (opt-in, with the content)."""

# MCP (the conventions' `mcp.*` attributes; the server's name is minions' own)
MCP_METHOD_NAME: Final = "mcp.method.name"
MCP_TOOLS_CALL: Final = "tools/call"
MINIONS_MCP_SERVER: Final = "minions.mcp.server"
MINIONS_MCP_TOOL: Final = "minions.mcp.tool"

# Plans (minions' own: the conventions have no planning operation yet)
OPERATION_PLAN: Final = "plan"
MINIONS_PLAN_REQUEST: Final = "minions.plan.request"

# -- OpenInference (Arize Phoenix and the backends that read it) -------------------------------

OPENINFERENCE_SPAN_KIND: Final = "openinference.span.kind"
"""What kind of step a span is, for backends that sort spans by OpenInference's kinds rather
than by ``gen_ai.operation.name`` (Phoenix showed the run's span as "unknown" without it)."""
OPENINFERENCE_KINDS: Final = {
    OPERATION_INVOKE_WORKFLOW: "CHAIN",
    OPERATION_PLAN: "CHAIN",
    OPERATION_INVOKE_AGENT: "AGENT",
    OPERATION_CHAT: "LLM",
    OPERATION_EXECUTE_TOOL: "TOOL",
}

# -- general conventions ----------------------------------------------------------------------

SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
ERROR_TYPE: Final = "error.type"

# -- minions.*: minions' own -------------------------------------------------------------------

MINIONS_RUN_ID: Final = "minions.run.id"
MINIONS_RUN_ATTEMPT: Final = "minions.run.attempt"
"""Which attempt of a durable run an execution is (as its events and ``runs show`` number
them): each park, hand-back or takeover goes on in the next."""
MINIONS_RUN_RESUMED: Final = "minions.run.resumed"
"""``true`` on the run's span of an execution that goes on from the run's stored work."""
MINIONS_RECIPE_ID: Final = "minions.recipe.id"
MINIONS_STEP_VISIT: Final = "minions.step.visit"
MINIONS_STEP_ITEM: Final = "minions.step.item"
MINIONS_STEP_KIND: Final = "minions.step.kind"
MINIONS_STEP_RESUMED_AT: Final = "minions.step.resumed_at"
"""The call a step goes on at (it waited there when its run parked), as its `StepStarted`
says."""
MINIONS_STEP_RESTARTED: Final = "minions.step.restarted"
"""Why a step that waited at a call starts again from its start instead."""
MINIONS_CUT_SHORT: Final = "minions.cut_short"
"""Why a span's work was cancelled without failing: its durable run's execution ended before
the run did (``parked``: a call waits for a person; ``handed_back``: its worker drains)."""
MINIONS_ATTEMPT: Final = "minions.attempt"
MINIONS_OUTPUT_MODE: Final = "minions.output_mode"
MINIONS_USAGE_INPUT_TOKENS: Final = "minions.usage.input_tokens"
MINIONS_USAGE_OUTPUT_TOKENS: Final = "minions.usage.output_tokens"
MINIONS_USAGE_CALLS: Final = "minions.usage.calls"
