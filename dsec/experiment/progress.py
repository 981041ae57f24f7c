"""Step progress of the experiment's workers, for the launcher's watchdog.

A worker's training loop beats (touches its beat file) as it enters each collective and
while it re-forms its group, and records its update duration there after each update. A
silent hang stops the beats while the process and its dsec heartbeat thread live on; a
member blocked in a collective by a hung peer stopped beating later than that peer. So
in a group the member that stopped beating first is the one the others wait for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

EMA_WEIGHT = 0.2  # of the newest update in the update duration's running mean


class ProgressBeat:
    """The worker's side: its beat file."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.update_s: float | None = None
        self.path.write_text("")

    def beat(self) -> None:
        os.utime(self.path)

    def record_update(self, duration_s: float) -> None:
        self.update_s = duration_s if self.update_s is None else \
            (1 - EMA_WEIGHT) * self.update_s + EMA_WEIGHT * duration_s
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{self.update_s:.4f}")
        tmp.replace(self.path)


@dataclass(frozen=True)
class Beat:
    at_s: float  # epoch seconds of the last beat
    update_s: float | None  # the worker's mean update duration, None before its first


def read_beat(path: Path) -> Beat | None:
    try:
        at_s = path.stat().st_mtime
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    try:
        update_s = float(text) if text else None
    except ValueError:  # read while being replaced
        update_s = None
    return Beat(at_s, update_s)


@dataclass(frozen=True)
class WatchdogConfig:
    """A member is hung once it has not beaten for ``timeout_updates`` of its own mean
    update durations, and at least ``min_timeout_s``: a window in steps, not seconds, so a
    slower host does not make healthy workers look hung."""

    timeout_updates: float = 8.0
    min_timeout_s: float = 4.0

    def timeout_s(self, beat: Beat) -> float:
        if beat.update_s is None:
            return self.min_timeout_s * 4  # not a single update yet: starting up
        return max(self.min_timeout_s, self.timeout_updates * beat.update_s)


def hung_member(beats: Mapping[int, Beat], now_s: float, config: WatchdogConfig) -> int | None:
    """The member of one group to restart: of those stalled past their timeout, the one
    that stopped beating first (the others wait on it); None if none."""
    stalled = [(beat.at_s, slot) for slot, beat in beats.items()
               if now_s - beat.at_s > config.timeout_s(beat)]
    return min(stalled)[1] if stalled else None


def stuck_members(beats: Mapping[int, Beat], now_s: float, stalled_s: float) -> list[int]:
    """Members that have not beaten for ``stalled_s`` (after a collective timed out: the
    launcher tears down what is still stuck, as torchrun does a failed node's workers)."""
    return sorted(slot for slot, beat in beats.items() if now_s - beat.at_s > stalled_s)


def slots_to_restart(beats: Mapping[int, Beat], now_s: float, watchdog: WatchdogConfig | None,
                     collective_timeout_s: float, peer_died: bool) -> list[int]:
    """The members of one group the launcher kills now: the hung one, where the arm has a
    progress watchdog; and, after a member of the group died, those stuck past the
    collective timeout (every arm's launcher)."""
    out = set()
    if watchdog is not None:
        hung = hung_member(beats, now_s, watchdog)
        if hung is not None:
            out.add(hung)
    if peer_died:
        out.update(stuck_members(beats, now_s, collective_timeout_s))
    return sorted(out)
