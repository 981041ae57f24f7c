"""A service process's collector: the young threshold raised, what was loaded frozen."""

from __future__ import annotations

import gc

import pytest

from dsec.infra.collector import tune_collector
from dsec.schemas.settings import DsecSettings


@pytest.fixture
def restored_collector():
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)
    gc.unfreeze()


def test_the_young_threshold_is_raised_and_the_older_ones_kept(restored_collector) -> None:
    gc.set_threshold(700, 10, 10)
    assert tune_collector(50_000) == (700, 10, 10)
    assert gc.get_threshold() == (50_000, 10, 10)


def test_what_is_alive_at_start_is_left_out_of_later_collections(restored_collector) -> None:
    loaded = [{"policy": index} for index in range(1000)]
    tune_collector(50_000)
    assert gc.get_freeze_count() >= len(loaded)


def test_a_cycle_made_after_start_is_still_collected(restored_collector) -> None:
    tune_collector(50_000)

    class Node:
        pass

    first, second = Node(), Node()
    first.peer, second.peer = second, first
    del first, second
    assert gc.collect() >= 2


def test_the_setting_is_bounded_and_zero_keeps_the_interpreters() -> None:
    assert DsecSettings().gc_young_objects == 50_000
    assert DsecSettings(gc_young_objects=0).gc_young_objects == 0
    with pytest.raises(ValueError):
        DsecSettings(gc_young_objects=-1)
