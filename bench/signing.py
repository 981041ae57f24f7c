"""``dsec bench signing``: the CPU a signature costs per command, the way the engine signs
and a node actuator verifies (an Ed25519 key file; the trust list file, one stat a
verification), with the hmac-dev mode beside it."""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from dsec.schemas import ActuationCommand, WorkerIdentity, now_ms
from dsec.schemas.actuations import MemoryCapParams

BLOCKS = 7


def _command() -> ActuationCommand:
    at = now_ms()
    return ActuationCommand(
        actuation_id="0" * 32, event_time_ms=at, expires_at_ms=at + 60_000,
        target=WorkerIdentity(job_id="bench", worker_id="rank-0", node_id="node-0"),
        policy_name="elastic-memory-quota", policy_version=3,
        action=MemoryCapParams(limit_bytes=6 << 30),
        reason="elastic-memory-quota v3 apply stage 1: gpu_memory_used_bytes > "
               "base_quota_bytes")


def _per_call_us(call: Callable[[], object], calls: int) -> float:
    """The median over blocks of the CPU time a call takes, in µs: the thread's own CPU
    time, so that other processes on a busy machine do not count."""
    call()
    per_block = max(1, calls // BLOCKS)
    means = []
    for _ in range(BLOCKS):
        started = time.thread_time()
        for _ in range(per_block):
            call()
        means.append((time.thread_time() - started) / per_block * 1e6)
    return statistics.median(means)


def signing_costs(commands: int = 5_000) -> dict[str, float | int]:
    from dsec.infra.keys import KeyFileSigner, TrustListFile, make_keyring
    from dsec.schemas.signing import HmacSigner, HmacVerifier, SignatureError, TrustListVerifier

    with tempfile.TemporaryDirectory(prefix="dsec-bench-signing-") as folder:
        keys = Path(folder) / "keys"
        make_keyring(keys)
        signer = KeyFileSigner(keys / "command-signer.pem")
        verifier = TrustListVerifier(TrustListFile(keys / "trust.json"))
        command = _command()
        signed = signer.sign(command)
        stranger = signed.model_copy(update={"signature": "ed25519:00000000000000ff:AA=="})

        def refuse() -> None:
            with contextlib.suppress(SignatureError):
                verifier.verify(stranger)

        hmac_signer, hmac_verifier = HmacSigner(b"k" * 32), HmacVerifier(b"k" * 32)
        hmac_signed = hmac_signer.sign(command)
        return {
            "commands": commands,
            "ed25519_sign_us": round(_per_call_us(lambda: signer.sign(command), commands), 1),
            "ed25519_verify_us": round(_per_call_us(lambda: verifier.verify(signed),
                                                    commands), 1),
            "unknown_key_refused_us": round(_per_call_us(refuse, commands), 1),
            "hmac_dev_sign_us": round(_per_call_us(lambda: hmac_signer.sign(command),
                                                   commands), 1),
            "hmac_dev_verify_us": round(_per_call_us(lambda: hmac_verifier.verify(hmac_signed),
                                                     commands), 1),
        }
