"""W5 — memory: snapshot and restore of a 2,000-message conversation.

A conversation of 2,000 messages alternating user/assistant text (~130 characters each) in
`InMemoryModelMemory`. Times taking a snapshot, and getting back an independent, usable
conversation from it (restored into a fresh conversation id; its length and a sample message
are checked). 3 warm-ups, 20 timed; a fresh conversation id each time.
"""

from __future__ import annotations

import gc
import time

from _common import emit, mark_imported, summary

from minions import InMemoryModelMemory, Message

mark_imported()

MESSAGES = 2000
TEXT = "x" * 120


def build(memory: InMemoryModelMemory, conversation: str) -> None:
    for i in range(MESSAGES):
        text = f"{i:06d} {TEXT}"
        memory.append(conversation, Message.user(text) if i % 2 == 0 else Message.assistant(text))


def _noop(value: str) -> tuple[str, str]:
    return (value, value)


def floor_us() -> float:
    """What the cheapest Python call costs right after `gc.collect()`, in the same position
    as the timed snapshot: the floor any O(1) operation measured this way sits on."""
    gc.collect()
    t0 = time.perf_counter()
    _noop("x")
    return (time.perf_counter() - t0) * 1e6


def warm_roundtrip_us(memory: InMemoryModelMemory, source: str) -> float:
    count = 10_000
    t0 = time.perf_counter()
    for i in range(count):
        memory.restore(memory.snapshot(source), f"warm-{i % 4}")
    return (time.perf_counter() - t0) / count * 1e6


def main() -> None:
    memory = InMemoryModelMemory()
    snapshot_us, restore_us, read_us, floors = [], [], [], []
    for rep in range(3 + 20):
        source, target = f"conversation-{rep}", f"restored-{rep}"
        build(memory, source)
        gc.collect()
        t0 = time.perf_counter()
        snapshot = memory.snapshot(source)
        t1 = time.perf_counter()
        memory.restore(snapshot, target)
        t2 = time.perf_counter()
        restored = memory.messages(target)
        t3 = time.perf_counter()
        # Independent and usable: the right length, the right content, and writes to the
        # source after the snapshot do not show in it.
        memory.append(source, Message.user("later"))
        assert len(restored) == MESSAGES
        assert len(memory.messages(target)) == MESSAGES
        assert restored[1234].content.startswith("001234")
        if rep >= 3:
            floors.append(floor_us())
            snapshot_us.append((t1 - t0) * 1e6)
            restore_us.append((t2 - t1) * 1e6)
            read_us.append((t3 - t2) * 1e6)
    roundtrip = [s + r for s, r in zip(snapshot_us, restore_us, strict=True)]
    emit(
        "W5",
        "InMemoryModelMemory",
        primary="roundtrip_us",
        metrics={
            "snapshot_us": summary(snapshot_us, "us"),
            "restore_us": summary(restore_us, "us"),
            "roundtrip_us": summary(roundtrip, "us"),
        },
        extra={
            "messages": MESSAGES,
            "read_all_messages_us": summary(read_us, "us"),
            "post_gc_call_floor_us": summary(floors, "us"),
            "warm_roundtrip_us": round(warm_roundtrip_us(memory, "conversation-0"), 3),
            "note": (
                "snapshot and restore are O(1); timed right after gc.collect() they mostly "
                "measure the interpreter's post-GC cold start (see post_gc_call_floor_us); "
                "warm_roundtrip_us is the mean over 10,000 back-to-back round trips; "
                "read_all_messages_us materializes all 2,000 messages as a tuple"
            ),
        },
    )


if __name__ == "__main__":
    main()
