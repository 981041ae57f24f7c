from __future__ import annotations

import pytest

from dsec.schemas import ActuationCommand, SignatureError, WorkerIdentity, sign, verify
from dsec.schemas.actuations import SnapshotParams

KEY = b"k" * 32


def _command() -> ActuationCommand:
    return ActuationCommand(
        actuation_id="a" * 16, event_time_ms=1_000, expires_at_ms=2_000,
        target=WorkerIdentity(job_id="j", worker_id="w", node_id="n"),
        policy_name="p", policy_version=1, action=SnapshotParams(),
    )


def test_signed_command_verifies() -> None:
    verify(sign(_command(), KEY), KEY)


def test_unsigned_wrong_key_and_tampered_are_refused() -> None:
    with pytest.raises(SignatureError, match="unsigned"):
        verify(_command(), KEY)
    signed = sign(_command(), KEY)
    with pytest.raises(SignatureError, match="does not match"):
        verify(signed, b"other-key")
    tampered = signed.model_copy(update={"policy_version": 2})
    with pytest.raises(SignatureError, match="does not match"):
        verify(tampered, KEY)
    with pytest.raises(SignatureError, match="scheme"):
        verify(signed.model_copy(update={"signature": "md5:abc"}), KEY)
