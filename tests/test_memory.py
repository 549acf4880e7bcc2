"""ModelMemory: conversations by id, immutable O(1) snapshots, restore and fork."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from minions import InMemoryModelMemory, Message, ModelMemory


def test_conversations_are_kept_by_id() -> None:
    memory: ModelMemory = InMemoryModelMemory()
    memory.append("a", Message.user("1"), Message.assistant("2"))
    memory.append("b", Message.user("x"))
    assert [m.content for m in memory.messages("a")] == ["1", "2"]
    assert [m.content for m in memory.messages("b")] == ["x"]
    assert memory.messages("unknown") == ()


def test_a_snapshot_does_not_change_when_the_conversation_does() -> None:
    memory = InMemoryModelMemory()
    memory.append("c", Message.user("1"))
    snapshot = memory.snapshot("c")
    memory.append("c", Message.assistant("2"))
    memory.restore(snapshot)
    memory.append("c", Message.assistant("other"))
    assert [m.content for m in snapshot.messages] == ["1"]
    assert [m.content for m in memory.messages("c")] == ["1", "other"]


def test_restore_brings_back_a_later_snapshot_after_an_earlier_one() -> None:
    memory = InMemoryModelMemory()
    memory.append("c", Message.user("1"))
    early = memory.snapshot("c")
    memory.append("c", Message.assistant("2"))
    late = memory.snapshot("c")
    memory.restore(early)
    memory.append("c", Message.assistant("x"))
    memory.restore(late)
    assert [m.content for m in memory.messages("c")] == ["1", "2"]
    assert [m.content for m in early.messages] == ["1"]


def test_restore_into_another_id_forks_the_conversation() -> None:
    memory = InMemoryModelMemory()
    memory.append("main", Message.user("shared"))
    memory.restore(memory.snapshot("main"), "fork")
    memory.append("fork", Message.assistant("fork only"))
    memory.append("main", Message.assistant("main only"))
    assert [m.content for m in memory.messages("fork")] == ["shared", "fork only"]
    assert [m.content for m in memory.messages("main")] == ["shared", "main only"]


def test_clear_forgets() -> None:
    memory = InMemoryModelMemory()
    memory.append("c", Message.user("1"))
    memory.clear("c")
    assert memory.messages("c") == ()


def test_snapshot_shares_storage_instead_of_copying() -> None:
    """O(1): taking a snapshot of a long conversation copies nothing."""
    memory = InMemoryModelMemory()
    memory.append("c", *(Message.user(str(i)) for i in range(2000)))
    first, second = memory.snapshot("c"), memory.snapshot("c")
    assert first.store is second.store
    assert first.length == 2000


operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 2), st.text(max_size=3)),
        st.tuples(st.just("snapshot"), st.integers(0, 2), st.just("")),
        st.tuples(st.just("restore"), st.integers(0, 2), st.integers(0, 20).map(str)),
    ),
    max_size=60,
)


@given(operations)
def test_memory_matches_a_model_of_immutable_lists(ops: list[tuple[str, int, str]]) -> None:
    """Against a reference of plain tuples: every snapshot keeps what it saw, forever."""
    memory = InMemoryModelMemory()
    model: dict[str, tuple[str, ...]] = {}
    snapshots = []
    for op, conversation, arg in ops:
        cid = f"c{conversation}"
        if op == "append":
            memory.append(cid, Message.user(arg))
            model[cid] = (*model.get(cid, ()), arg)
        elif op == "snapshot":
            snapshots.append((memory.snapshot(cid), model.get(cid, ())))
        elif snapshots:
            snapshot, expected = snapshots[int(arg) % len(snapshots)]
            memory.restore(snapshot, cid)
            model[cid] = expected
        for other, expected in model.items():
            assert tuple(m.content for m in memory.messages(other)) == expected
        for snapshot, expected in snapshots:
            assert tuple(m.content for m in snapshot.messages) == expected


def test_a_snapshot_is_a_value_of_its_messages() -> None:
    memory = InMemoryModelMemory()
    memory.append("c", Message.user("a"), Message.assistant("b"))
    first = memory.snapshot("c")
    assert len(first) == 2
    assert first == memory.snapshot("c")
    memory.append("c", Message.user("c"))
    assert len(first) == 2
    assert first != memory.snapshot("c")
    assert "store" not in repr(first)
