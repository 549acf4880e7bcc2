"""Content capture: a model call's request and answer as events keep them, bounded.

Only used when `RunSettings.capture_content` is on. Prompts can be long (a tool loop's
history, a document in the goal) and events are stored with durable runs, so each message is
cut at `MESSAGE_CHARS` and the request at `TOTAL_CHARS`, each cut saying so; URL credentials
are hidden, as on spans.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from minions._tracing.tracer import hide_credentials

if TYPE_CHECKING:
    from minions._messages import Message
    from minions.events import MessageRecord

__all__: list[str] = []

MESSAGE_CHARS = 8_000
"""The most characters kept of one message's text (and of an answer)."""
TOTAL_CHARS = 20_000
"""The most characters kept of one request's messages together."""


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n… [cut: {len(text) - limit:,} more characters not kept]"


def _text(message: Message) -> str:
    """The message as one text: a tool result says which call it answers, an assistant's
    tool calls follow its text, one a line."""
    text = message.content
    if message.role == "tool":
        answered = " ".join(filter(None, (message.name, message.tool_call_id))) or "tool"
        text = f"[{answered}]\n{text}"
    for call in message.tool_calls:
        arguments = json.dumps(dict(call.arguments), default=str, ensure_ascii=False)
        text += f"\n→ {call.name}({arguments}) [{call.id}]"
    return hide_credentials(text.strip("\n"))


def captured_messages(messages: Sequence[Message]) -> tuple[tuple[MessageRecord, ...], int]:
    """The request's messages as events keep them, and how many were left out.

    The first message (the instructions, usually) and the last ones (what this turn adds)
    are kept; messages in between are left out once the total would pass `TOTAL_CHARS`.
    """
    from minions.events import MessageRecord

    texts = [_cut(_text(m), MESSAGE_CHARS) for m in messages]
    if not texts:
        return (), 0
    budget = TOTAL_CHARS - len(texts[0])
    tail: list[int] = []
    for index in range(len(texts) - 1, 0, -1):
        if len(texts[index]) > budget:
            if not tail and budget > 0:  # the newest message is kept, cut to what is left
                texts[index] = _cut(texts[index], budget)
                tail.append(index)
            break
        budget -= len(texts[index])
        tail.append(index)
    kept = [0, *reversed(tail)]
    records = tuple(MessageRecord(role=messages[i].role, text=texts[i]) for i in kept)
    return records, len(texts) - len(kept)


def captured_answer(text: str) -> str:
    """The answer's text as events keep it."""
    return hide_credentials(_cut(text, MESSAGE_CHARS))
