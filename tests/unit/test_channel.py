"""The local channel's framing and bookkeeping, without a broker."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import pytest

from dsec.actuators.channel import (
    MAX_FRAME_BYTES,
    Answer,
    Apply,
    ChannelError,
    Register,
    decode_frame,
    encode_frame,
    prepare_run_dir,
    read_frame,
)
from dsec.actuators.desired_state import Accepted, DesiredStateBook, OutOfOrder, worker_key
from dsec.schemas import ActuationCommand, ActuationStatus, WorkerIdentity
from dsec.schemas.actuations import MemoryCapParams, PrecisionParams, SnapshotParams

WORKER = WorkerIdentity(job_id="j", worker_id="w", node_id="n")


def _command(actuation_id: str, at_ms: int, action=None) -> ActuationCommand:
    return ActuationCommand(actuation_id=actuation_id, event_time_ms=at_ms,
                            expires_at_ms=at_ms + 60_000, target=WORKER, policy_name="p",
                            policy_version=1, action=action or PrecisionParams(dtype="fp16"))


def test_frames_round_trip_over_a_socket_pair() -> None:
    left, right = socket.socketpair()
    frames = [Register(identity=WORKER, pid=1),
              Apply(actuation_id="a1", action=PrecisionParams(dtype="bf16"),
                    command_time_ms=5, replay=True),
              Answer(actuation_id="a1", status=ActuationStatus.APPLIED, detail="ok",
                     requested="bf16", in_force="bf16")]
    for frame in frames:
        left.sendall(encode_frame(frame))
    assert [read_frame(right) for _ in frames] == frames
    left.close()
    with pytest.raises(ChannelError):
        read_frame(right)


def test_frames_are_validated_never_evaluated() -> None:
    with pytest.raises(ChannelError):
        decode_frame(b'{"type": "apply", "actuation_id": "x", "command_time_ms": 1,'
                     b' "action": {"kind": "memory_cap", "limit_bytes": 1}}')
    with pytest.raises(ChannelError):
        decode_frame(b'__import__("os").system("true")')
    left, right = socket.socketpair()
    left.sendall((MAX_FRAME_BYTES + 1).to_bytes(4, "big"))
    with pytest.raises(ChannelError):
        read_frame(right)


def test_run_dir_is_made_owner_only(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o755)
    run_dir.chmod(0o755)
    prepare_run_dir(run_dir)
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700


def test_desired_state_orders_supersedes_and_replays() -> None:
    book = DesiredStateBook()
    key = worker_key(_command("a" * 8, 1))
    assert book.accept(_command("first-00", 10)) == Accepted()
    superseding = book.accept(_command("second-0", 20))
    assert isinstance(superseding, Accepted) and superseding.superseded.actuation_id == "first-00"
    assert isinstance(book.accept(_command("older-00", 15)), OutOfOrder)
    assert [c.actuation_id for c in book.undelivered(key)] == ["second-0"]
    book.mark_delivered(key, "second-0")
    book.accept(_command("snap-000", 30, SnapshotParams()))
    book.mark_delivered(key, "snap-000")
    assert [c.actuation_id for c in book.desired(key)] == ["second-0"]  # snapshots are events
    book.accept(_command("snap-001", 40, SnapshotParams()))  # replaces snap-000, in flight
    book.mark_delivered(key, "snap-001")
    book.forget_answered(key, "snap-000")  # the older snapshot's answer
    assert [c.actuation_id for c in book.commands()] == ["second-0", "snap-001"]
    book.forget_answered(key, "snap-001")
    assert [c.actuation_id for c in book.commands()] == ["second-0"]


def test_desired_state_keeps_the_command_in_force_apart_from_the_one_requested() -> None:
    book = DesiredStateBook()
    key = worker_key(_command("cmd-zero", 0))
    fp16 = _command("cmd-fp16", 1_000)
    bf16 = _command("cmd-bf16", 2_000, PrecisionParams(dtype="bf16"))
    book.accept(fp16)
    book.mark_delivered(key, "cmd-fp16")
    assert book.mark_applied(key, "cmd-fp16")
    book.accept(bf16)  # the worker cannot carry it out (its answer: unsupported)
    book.mark_delivered(key, "cmd-bf16")
    assert book.requested(key)["precision"] is bf16
    assert book.in_force(key)["precision"] is fp16  # still what the worker runs
    assert book.desired(key) == [bf16]  # sent again should the worker register again
    book.accept(snapshot := _command("cmd-snap", 3_000, SnapshotParams()))
    book.mark_delivered(key, "cmd-snap")
    book.mark_applied(key, "cmd-snap")
    assert "snapshot" not in book.in_force(key)  # an event, not a setting
    assert snapshot is book.requested(key)["snapshot"]


def test_a_command_that_stops_holding_leaves_the_state_in_force_and_stays_desired() -> None:
    book = DesiredStateBook()
    cap = _command("cmd-cap-1", 1_000, MemoryCapParams(limit_bytes=4 << 30))
    key = worker_key(cap)
    book.accept(cap)
    book.mark_delivered(key, "cmd-cap-1")
    book.mark_applied(key, "cmd-cap-1")
    assert book.in_force(key)["memory_cap"] is cap
    book.mark_not_applied(key, "cmd-cap-1")  # lifted: the live memory outgrew it
    assert "memory_cap" not in book.in_force(key)
    assert book.desired(key) == [cap]  # a restarted worker is given it again
    book.mark_applied(key, "cmd-cap-1")  # set again
    assert book.in_force(key)["memory_cap"] is cap


def test_auto_mode_uses_the_socket_only_when_a_daemon_answers() -> None:
    import tempfile

    from dsec.runtime import _listening

    path = Path(tempfile.mkdtemp(prefix="dsec-t-")) / "a.sock"
    assert not _listening(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    assert _listening(path)
    server.close()  # the file stays, as after a crash
    assert path.exists() and not _listening(path)
    path.unlink()
    path.parent.rmdir()


class _FakeConnection:
    def __init__(self) -> None:
        self.sent: list[Apply] = []

    def send(self, frame: Apply) -> bool:
        self.sent.append(frame)
        return True


def test_answers_to_snapshots_in_flight_together_are_reported_with_their_command(
        tmp_path: Path) -> None:
    """A worker busy in a long step gets a second snapshot before it answers the first:
    both answers are reported as snapshots of their own command."""
    import orjson
    from keys import KEYRING, VERIFIER

    from dsec.actuators import NodeActuator, NodeActuatorConfig
    from dsec.schemas import encode, now_ms

    published: list[dict] = []
    daemon = NodeActuator(
        NodeActuatorConfig(node_id="n", run_dir=tmp_path, actuations_topic="a",
                           results_topic="r", verifier=VERIFIER),
        {}, lambda _topic, _key, value: published.append(orjson.loads(value)))
    connection = _FakeConnection()
    daemon.delivery.register(("j", "w"), connection)
    at = now_ms()
    first, second = (KEYRING.sign(_command(f"snap-{i:03d}", at + i, SnapshotParams()))
                     for i in range(2))
    for command in (first, second):
        daemon.receive(encode(command))
    assert [frame.actuation_id for frame in connection.sent] == ["snap-000", "snap-001"]
    for command in (first, second):
        daemon.delivery.answered(("j", "w"), WORKER, Answer(
            actuation_id=command.actuation_id, status=ActuationStatus.APPLIED))
    assert [(r["actuation_id"], r["action_kind"], r["status"], r.get("command_time_ms"))
            for r in published] == [("snap-000", "snapshot", "applied", at),
                                    ("snap-001", "snapshot", "applied", at + 1)]
    assert daemon.delivery.commands() == []
