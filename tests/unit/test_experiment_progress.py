"""The launcher's watchdog: liveness from step progress, in steps, not heartbeats."""

from __future__ import annotations

import os

import pytest

from dsec.experiment.progress import (
    Beat,
    ProgressBeat,
    WatchdogConfig,
    hung_member,
    read_beat,
    slots_to_restart,
)

CONFIG = WatchdogConfig(timeout_updates=8.0, min_timeout_s=4.0)


def test_the_timeout_is_counted_in_the_workers_own_updates() -> None:
    assert CONFIG.timeout_s(Beat(0.0, 0.2)) == 4.0  # the floor
    assert CONFIG.timeout_s(Beat(0.0, 2.0)) == 16.0  # a slower host waits longer
    assert CONFIG.timeout_s(Beat(0.0, None)) == 16.0  # starting up


@pytest.mark.parametrize("update_s", [0.25, 1.5, 3.0, 5.0])
def test_the_default_watchdog_ends_a_hung_member_before_its_peers_time_out(update_s) -> None:
    # From the reference host's update time to a host 20x slower, with the scenario's
    # spans unscaled (``--time-scale 1``, the default): the hung member is ended before the
    # collective timeout ends its peers too (two interruptions, not one).
    from dsec.experiment.faults import Scenario

    scenario = Scenario(name="s")
    watchdog = WatchdogConfig(scenario.progress_timeout_updates,
                              scenario.progress_timeout_min_s)
    polled_s = 0.5  # the launcher looks every half second
    assert watchdog.timeout_s(Beat(0.0, update_s)) + polled_s < scenario.collective_timeout_s


def test_the_member_that_stopped_first_is_the_hung_one() -> None:
    # 0 hung at 100 s; 1 entered the all-reduce at 101 s and waits on it
    beats = {0: Beat(100.0, 1.0), 1: Beat(101.0, 1.0)}
    assert hung_member(beats, 105.0, CONFIG) is None
    assert hung_member(beats, 110.0, CONFIG) == 0
    assert hung_member({1: Beat(109.0, 1.0)}, 110.0, CONFIG) is None


def test_without_a_watchdog_only_a_peers_death_tears_down_the_stuck() -> None:
    beats = {0: Beat(100.0, 1.0), 1: Beat(118.0, 1.0)}
    assert slots_to_restart(beats, 121.0, None, 20.0, peer_died=False) == []
    assert slots_to_restart(beats, 121.0, None, 20.0, peer_died=True) == [0]
    assert slots_to_restart(beats, 121.0, CONFIG, 20.0, peer_died=False) == [0]


def test_beats_and_update_durations_round_trip(tmp_path) -> None:
    path = tmp_path / "beats" / "worker-000"
    progress = ProgressBeat(path)
    assert read_beat(path).update_s is None
    progress.record_update(1.0)
    progress.record_update(2.0)
    assert read_beat(path).update_s == pytest.approx(1.2)
    os.utime(path, (50.0, 50.0))
    progress.beat()
    assert read_beat(path).at_s > 50.0
    assert read_beat(tmp_path / "absent") is None
