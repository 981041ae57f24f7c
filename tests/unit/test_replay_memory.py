from __future__ import annotations

import pytest

from dsec.actuators.replay_memory import ReplayMemory


def test_ids_are_kept_until_expiry_plus_the_margin() -> None:
    memory = ReplayMemory(capacity=10, keep_after_expiry_ms=100)
    assert memory.remember("a", expires_at_ms=1_000, now_ms=0)
    assert memory.remember("b", expires_at_ms=2_000, now_ms=0)
    assert memory.forget_expired(1_099) == 0 and "a" in memory
    assert memory.forget_expired(1_100) == 1 and "a" not in memory and "b" in memory


def test_a_full_memory_refuses_new_ids_until_one_expires() -> None:
    memory = ReplayMemory(capacity=2)
    assert memory.remember("a", 1_000, now_ms=0) and memory.remember("b", 5_000, now_ms=0)
    assert not memory.remember("c", 9_000, now_ms=999)
    assert "a" in memory and "b" in memory and len(memory) == 2
    assert memory.remember("c", 9_000, now_ms=1_000)
    assert "a" not in memory and len(memory) == 2
    assert memory.remember("b", 5_000, now_ms=1_000)  # already kept


def test_bounds_are_validated() -> None:
    with pytest.raises(ValueError):
        ReplayMemory(capacity=0)
