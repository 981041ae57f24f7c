"""The hmac-dev mode: one shared key (Ed25519 and the trust list: test_trust.py)."""

from __future__ import annotations

import pytest

from dsec.schemas import ActuationCommand, SignatureError, WorkerIdentity
from dsec.schemas.actuations import SnapshotParams
from dsec.schemas.signing import HmacSigner, HmacVerifier

KEY = b"k" * 32


def _command() -> ActuationCommand:
    return ActuationCommand(
        actuation_id="a" * 16, event_time_ms=1_000, expires_at_ms=2_000,
        target=WorkerIdentity(job_id="j", worker_id="w", node_id="n"),
        policy_name="p", policy_version=1, action=SnapshotParams(),
    )


def sign(model, key: bytes):
    return HmacSigner(key).sign(model)


def verify(model, key: bytes) -> None:
    HmacVerifier(key).verify(model)


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


def test_the_dev_mode_is_explicit() -> None:
    from dsec.schemas.settings import DsecSettings

    with pytest.raises(ValueError, match="DSEC_SIGNING_MODE=hmac-dev"):
        DsecSettings(signing_key="shared")
    settings = DsecSettings(signing_mode="hmac-dev", signing_key="shared")
    assert settings.signing_key_bytes() == b"shared"
    from dsec.infra.keys import signer_for, signing_env, verifier_for
    from dsec.schemas.trust import KeyRole

    signed = signer_for(settings, KeyRole.COMMAND_SIGNER).sign(_command())
    assert signed.signature.startswith("hmac-sha256:")
    verifier_for(settings).verify(signed)
    assert signing_env(settings) == {"DSEC_SIGNING_MODE": "hmac-dev",
                                     "DSEC_SIGNING_KEY": "shared"}
