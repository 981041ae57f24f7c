"""Joining a data-parallel group: a member waiting for a replacement to arrive beats."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import torch.distributed as dist

from dsec.actuators.worker_controls import WorkerControls
from dsec.experiment.assignment import Assignment
from dsec.experiment.runner import spares_per_arm
from dsec.experiment.worker_group import GroupSync


def _member(tmp_path, port: int, rank: int) -> GroupSync:
    assignment = Assignment(
        arm="strong", slot=rank, group=0, rank=rank, group_size=2, node_id="node-00",
        store_port=port, run_dir=str(tmp_path), scenario_file="", t0_s=time.time(),
        end_at_s=time.time() + 60, seed=0, incarnation=0, job_id="j")
    return GroupSync(assignment, [], None, WorkerControls(), None, None)


def test_a_member_waits_for_its_peer_beating_and_gives_up_when_the_generation_moves(
        tmp_path) -> None:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10))
    store.add("strong/group-0/gen", 0)
    first = _member(tmp_path, store.port, 0)
    beats_before = first.progress.path.stat().st_mtime_ns
    # its peer never arrives; the launcher moves the group to generation 1 after 0.5 s
    mover = threading.Timer(0.5, lambda: store.add("strong/group-0/gen", 1))
    mover.start()
    assert first._await_peers(0) is False
    mover.join()
    assert first.progress.path.stat().st_mtime_ns > beats_before  # it beat while waiting
    # generation 1: the peer is there, so the wait ends at once
    store.set("strong/group-0/arrived/1/1", "1")
    assert first._await_peers(1) is True


def test_half_an_arms_workers_are_kept_warm_as_spares_within_bounds() -> None:
    assert [spares_per_arm(n) for n in (1, 2, 4, 8, 16)] == [2, 2, 2, 4, 4]


def test_the_groups_loop_counts_as_attached_before_its_first_update(tmp_path) -> None:
    # A restarted worker is given its node's desired state before it has stepped: the
    # group's loop takes precision, accumulation, compression and priority every update.
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10))
    controls = _member(tmp_path, store.port, 0)._controls
    assert all(setting.attached for setting in (
        controls.precision, controls.grad_accumulation, controls.grad_compression,
        controls.sync_priority))
