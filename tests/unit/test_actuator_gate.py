from __future__ import annotations

from dsec.actuators import ApplyHooks, CommandGate, NoApplyHookError
from dsec.schemas import ActuationCommand, ActuationStatus, WorkerIdentity, sign
from dsec.schemas.actuations import PrecisionParams, SnapshotParams

KEY = b"key"
HERE = WorkerIdentity(job_id="j", worker_id="w0", node_id="n0")


def _command(actuation_id: str = "a" * 16, **changes: object) -> ActuationCommand:
    fields = dict(actuation_id=actuation_id, event_time_ms=1_000, expires_at_ms=61_000,
                  target=HERE, policy_name="p", policy_version=1, action=SnapshotParams())
    fields.update(changes)
    return sign(ActuationCommand(**fields), KEY)


def test_fresh_signed_command_passes_once() -> None:
    gate = CommandGate(HERE, KEY)
    assert gate.check(_command(), now_ms=2_000) is None
    again = gate.check(_command(), now_ms=2_000)
    assert again is not None and again.duplicate


def test_expired_unsigned_and_foreign_commands() -> None:
    gate = CommandGate(HERE, KEY)
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
    assert hooks.apply(SnapshotParams()) == "saved"
    try:
        hooks.apply(PrecisionParams(dtype="fp16"))
    except NoApplyHookError as exc:
        assert exc.kind.value == "precision"
    else:
        raise AssertionError("expected NoApplyHookError")
