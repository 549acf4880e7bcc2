"""Model memory: conversations kept by id, with O(1) snapshots for transactional retries."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from minions._messages import Message

__all__ = ["InMemoryModelMemory", "MemorySnapshot", "ModelMemory"]


@dataclass(frozen=True, slots=True, eq=False)
class MemorySnapshot:
    """An immutable view of a conversation at one moment.

    It holds a reference to a message list and a length. Memories only ever append past the
    length a snapshot saw, and copy before writing into a shared prefix, so later writes never
    change what a snapshot holds. ``len(snapshot)`` is its number of messages.
    """

    conversation_id: str
    store: list[Message]
    length: int

    @property
    def messages(self) -> tuple[Message, ...]:
        """The conversation's messages when the snapshot was taken."""
        return tuple(self.store[: self.length])

    def __len__(self) -> int:
        return self.length

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MemorySnapshot):
            return NotImplemented
        return (
            self.conversation_id == other.conversation_id
            and self.length == other.length
            and (self.store is other.store or self.messages == other.messages)
        )

    def __hash__(self) -> int:
        return hash((self.conversation_id, self.length))

    def __repr__(self) -> str:
        return f"MemorySnapshot({self.conversation_id!r}, length={self.length})"


class ModelMemory(ABC):
    """Keeps conversations by id.

    Implementations must make `snapshot` cheap (it runs before every model call) and keep
    snapshots immutable: a later `append` must not change a snapshot taken earlier.
    """

    @abstractmethod
    def messages(self, conversation_id: str) -> tuple[Message, ...]:
        """The conversation's messages, oldest first (empty for an unknown id)."""

    @abstractmethod
    def append(self, conversation_id: str, *messages: Message) -> None:
        """Add messages at the end of a conversation, creating it if needed."""

    @abstractmethod
    def snapshot(self, conversation_id: str) -> MemorySnapshot:
        """An immutable value of the conversation as it is now."""

    @abstractmethod
    def restore(self, snapshot: MemorySnapshot, conversation_id: str | None = None) -> None:
        """Put a snapshot back, into its own conversation or into `conversation_id` (a fork)."""

    def clear(self, conversation_id: str) -> None:
        """Forget a conversation."""
        self.restore(MemorySnapshot(conversation_id, [], 0))


class _Conversation:
    __slots__ = ("length", "messages")

    def __init__(self, messages: list[Message], length: int) -> None:
        self.messages = messages
        self.length = length


class InMemoryModelMemory(ModelMemory):
    """Conversations in process memory.

    Appends are amortized O(1); `snapshot` and `restore` are O(1) whatever the length.
    """

    def __init__(self) -> None:
        self._conversations: dict[str, _Conversation] = {}

    def messages(self, conversation_id: str) -> tuple[Message, ...]:
        conversation = self._conversations.get(conversation_id)
        if conversation is None:
            return ()
        return tuple(conversation.messages[: conversation.length])

    def append(self, conversation_id: str, *messages: Message) -> None:
        conversation = self._conversations.get(conversation_id)
        if conversation is None:
            self._conversations[conversation_id] = _Conversation(list(messages), len(messages))
            return
        if len(conversation.messages) != conversation.length:
            # A snapshot restored to a shorter length: the tail beyond it may belong to other
            # snapshots, so copy the prefix instead of overwriting in place.
            conversation.messages = conversation.messages[: conversation.length]
        conversation.messages.extend(messages)
        conversation.length += len(messages)

    def snapshot(self, conversation_id: str) -> MemorySnapshot:
        conversation = self._conversations.get(conversation_id)
        if conversation is None:
            return MemorySnapshot(conversation_id, [], 0)
        return MemorySnapshot(conversation_id, conversation.messages, conversation.length)

    def restore(self, snapshot: MemorySnapshot, conversation_id: str | None = None) -> None:
        target = snapshot.conversation_id if conversation_id is None else conversation_id
        self._conversations[target] = _Conversation(snapshot.store, snapshot.length)
