"""Ed25519 keys for tests: a keyring with a key per role, the verifier that trusts it,
and a forger's keyring that no trust list here holds."""

from __future__ import annotations

from dsec.schemas.signing import TrustListVerifier, new_keyring

EXPIRES_AT_MS = 32_000_000_000_000  # valid whatever clock a test runs on

KEYRING, TRUST, PRIVATE_KEYS = new_keyring(expires_at_ms=EXPIRES_AT_MS)
VERIFIER = TrustListVerifier(TRUST)
FORGER, _, _ = new_keyring(expires_at_ms=EXPIRES_AT_MS)
