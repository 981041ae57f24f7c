from __future__ import annotations

from keys import FORGER, KEYRING, VERIFIER

from dsec.actuators import ApplyHooks, CommandGate, NoApplyHookError
from dsec.schemas import ActuationCommand, ActuationStatus, WorkerIdentity
from dsec.schemas.actuations import PrecisionParams, SnapshotParams

HERE = WorkerIdentity(job_id="j", worker_id="w0", node_id="n0")


def _command(actuation_id: str = "a" * 16, **changes: object) -> ActuationCommand:
    fields = dict(actuation_id=actuation_id, event_time_ms=1_000, expires_at_ms=61_000,
                  target=HERE, policy_name="p", policy_version=1, action=SnapshotParams())
    fields.update(changes)
    return KEYRING.sign(ActuationCommand(**fields))


def test_fresh_signed_command_passes_once() -> None:
    gate = CommandGate(HERE, VERIFIER)
    assert gate.check(_command(), now_ms=2_000) is None
    again = gate.check(_command(), now_ms=2_000)
    assert again is not None and again.duplicate


def test_expired_unsigned_and_foreign_commands() -> None:
    gate = CommandGate(HERE, VERIFIER)
    expired = gate.check(_command("b" * 16), now_ms=61_000)
    assert expired is not None and expired.status is ActuationStatus.STALE
    unsigned = _command("c" * 16).model_copy(update={"signature": None})
    rejected = gate.check(unsigned, now_ms=2_000)
    assert rejected is not None and rejected.status is ActuationStatus.REJECTED
    other = _command("d" * 16, target=HERE.model_copy(update={"worker_id": "w1"}))
    assert not gate.addressed_here(other)
    assert gate.addressed_here(_command("e" * 16))


def test_apply_hooks_dispatch_by_kind() -> None:
    hooks = ApplyHooks()
    hooks.register("snapshot", lambda params: "saved")
    assert hooks.apply(SnapshotParams()).detail == "saved"
    try:
        hooks.apply(PrecisionParams(dtype="fp16"))
    except NoApplyHookError as exc:
        assert exc.kind.value == "precision"
    else:
        raise AssertionError("expected NoApplyHookError")


def test_a_forgery_carrying_a_real_id_does_not_stop_the_real_command() -> None:
    gate = CommandGate(HERE, VERIFIER)
    genuine = _command("f" * 16)
    forged = FORGER.sign(genuine.model_copy(update={"signature": None}))
    rejected = gate.check(forged, now_ms=2_000)
    assert rejected is not None and not rejected.verified
    assert rejected.status is ActuationStatus.REJECTED and not gate.known(genuine.actuation_id)
    assert gate.check(genuine, now_ms=2_000) is None
    assert not gate.reportable(forged, gate.check(forged, now_ms=2_000))  # the real id's record


def test_a_flood_of_forgeries_leaves_the_replay_memory_to_verified_ids() -> None:
    gate = CommandGate(HERE, VERIFIER, remember=1_000)
    genuine = _command("g" * 16)
    assert gate.check(genuine, now_ms=2_000) is None
    for n in range(20_000):
        forged = _command(f"forged-{n:08d}").model_copy(update={"signature": "hmac-sha256:00"})
        assert gate.check(forged, now_ms=2_000) is not None
    replay = gate.check(genuine, now_ms=2_000)
    assert replay is not None and replay.duplicate


def test_a_genuine_command_for_another_worker_touches_nothing() -> None:
    gate = CommandGate(HERE, VERIFIER)
    foreign = _command("h" * 16, target=HERE.model_copy(update={"worker_id": "w1"}))
    rejected = gate.check(foreign, now_ms=2_000)
    assert rejected is not None and not rejected.addressed
    assert not gate.reportable(foreign, rejected)
    assert not gate.known(foreign.actuation_id)


def test_a_command_dated_beyond_the_clock_skew_bound_is_refused() -> None:
    gate = CommandGate(HERE, VERIFIER, max_future_ms=5_000)
    ahead = _command("i" * 16, event_time_ms=10_000, expires_at_ms=70_000)
    rejected = gate.check(ahead, now_ms=4_000)
    assert rejected is not None and rejected.status is ActuationStatus.REJECTED
    assert "ahead of this clock" in rejected.detail and not gate.known(ahead.actuation_id)
    assert gate.check(_command("j" * 16, event_time_ms=8_000, expires_at_ms=68_000),
                      now_ms=4_000) is None  # within the bound


def test_a_full_memory_refuses_rather_than_forgets_an_unexpired_id() -> None:
    gate = CommandGate(HERE, VERIFIER, remember=2, max_future_ms=0)
    assert gate.check(_command("k" * 16), now_ms=2_000) is None
    assert gate.check(_command("l" * 16), now_ms=2_000) is None
    full = gate.check(_command("m" * 16), now_ms=2_000)
    assert full is not None and "replay memory full" in full.detail
    assert gate.check(_command("k" * 16), now_ms=2_000).duplicate  # not forgotten
    later = _command("n" * 16, event_time_ms=61_000, expires_at_ms=120_000)
    assert gate.check(later, now_ms=61_000) is None  # the expired ids made room
