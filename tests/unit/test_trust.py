"""Ed25519 signatures against a trust list: roles, expiry, revocation, key files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dsec.infra.keys import (
    KeyFileSigner,
    TrustListFile,
    key_path,
    make_keyring,
    read_trust_list,
    signer_for,
    verifier_for,
    write_private_key,
    write_trust_list,
)
from dsec.schemas import ActuationCommand, PolicyDeletion, PolicySpec, PoolSpec, WorkerIdentity
from dsec.schemas.actuations import SnapshotParams
from dsec.schemas.settings import DsecSettings
from dsec.schemas.signing import (
    Ed25519Signer,
    HmacSigner,
    Keyring,
    SignatureError,
    TrustListVerifier,
    new_keyring,
)
from dsec.schemas.trust import KeyRole, TrustedKey, TrustList

NOW_MS = 1_700_000_000_000
LATER_MS = NOW_MS + 86_400_000


def _command() -> ActuationCommand:
    return ActuationCommand(
        actuation_id="a" * 16, event_time_ms=1_000, expires_at_ms=2_000,
        target=WorkerIdentity(job_id="j", worker_id="w", node_id="n"),
        policy_name="p", policy_version=1, action=SnapshotParams(),
    )


def _policy(pools: list[str] | None = None) -> PolicySpec:
    return PolicySpec.model_validate({
        "name": "p", "condition": "gpu_temperature_c > 90",
        "selector": {"pools": pools or []},
        "action": {"params": {"kind": "snapshot"}},
    })


def test_a_signature_names_its_key_and_verifies_against_the_trust_list() -> None:
    keyring, trust, _ = new_keyring(expires_at_ms=LATER_MS)
    signed = keyring.sign(_command())
    scheme, key_id, _ = signed.signature.split(":", 2)
    assert scheme == "ed25519"
    assert trust.get(key_id).role is KeyRole.COMMAND_SIGNER
    by = TrustListVerifier(trust).verify(signed, NOW_MS)
    assert (by.key_id, by.role) == (key_id, KeyRole.COMMAND_SIGNER)


def test_unsigned_tampered_unknown_and_foreign_scheme_are_refused() -> None:
    keyring, trust, _ = new_keyring(expires_at_ms=LATER_MS)
    verifier = TrustListVerifier(trust)
    with pytest.raises(SignatureError, match="unsigned"):
        verifier.verify(_command(), NOW_MS)
    signed = keyring.sign(_command())
    with pytest.raises(SignatureError, match="does not match"):
        verifier.verify(signed.model_copy(update={"policy_version": 2}), NOW_MS)
    stranger, _, _ = new_keyring(expires_at_ms=LATER_MS)
    with pytest.raises(SignatureError, match="not in the trust list"):
        verifier.verify(stranger.sign(_command()), NOW_MS)
    with pytest.raises(SignatureError, match="scheme"):
        verifier.verify(HmacSigner(b"shared").sign(_command()), NOW_MS)
    _, key_id, _ = signed.signature.split(":", 2)
    with pytest.raises(SignatureError, match="base64"):
        verifier.verify(signed.model_copy(update={"signature": f"ed25519:{key_id}:!!"}),
                        NOW_MS)


def test_a_key_signs_only_what_its_role_may() -> None:
    keyring, trust, private = new_keyring(expires_at_ms=LATER_MS)
    verifier = TrustListVerifier(trust)
    publisher = Ed25519Signer(private[KeyRole.POLICY_PUBLISHER])
    with pytest.raises(SignatureError, match="policy-publisher key; a ActuationCommand needs"):
        verifier.verify(publisher.sign(_command()), NOW_MS)
    engine = Ed25519Signer(private[KeyRole.COMMAND_SIGNER])
    with pytest.raises(SignatureError, match="command-signer key; a PolicySpec needs"):
        verifier.verify(engine.sign(_policy()), NOW_MS)
    assert verifier.verify(keyring.sign(_policy()), NOW_MS).role is KeyRole.POLICY_PUBLISHER
    deletion = keyring.sign(PolicyDeletion(deletes="p", up_to_version=1))
    assert verifier.verify(deletion, NOW_MS).role is KeyRole.POLICY_PUBLISHER
    pool = Ed25519Signer(private[KeyRole.POOL_PUBLISHER])
    with pytest.raises(SignatureError, match="pool-publisher key; a PolicySpec needs"):
        verifier.verify(pool.sign(_policy()), NOW_MS)
    assert verifier.verify(pool.sign(PoolSpec(name="A")), NOW_MS).role is (
        KeyRole.POOL_PUBLISHER)
    with pytest.raises(SignatureError, match="a PoolSpec needs a pool-publisher key"):
        verifier.verify(publisher.sign(PoolSpec(name="A")), NOW_MS)


def test_a_keyring_without_the_role_signs_nothing() -> None:
    _, _, private = new_keyring((KeyRole.COMMAND_SIGNER,), expires_at_ms=LATER_MS)
    keyring = Keyring({KeyRole.COMMAND_SIGNER: Ed25519Signer(private[KeyRole.COMMAND_SIGNER])})
    with pytest.raises(SignatureError, match="no policy-publisher key here"):
        keyring.sign(_policy())


def _entry(trust: TrustList, role: KeyRole) -> TrustedKey:
    return next(key for key in trust.keys if key.role is role)


def test_expired_not_yet_valid_and_revoked_keys_are_refused() -> None:
    keyring, trust, _ = new_keyring(expires_at_ms=LATER_MS)
    signed = keyring.sign(_command())
    entry = _entry(trust, KeyRole.COMMAND_SIGNER)
    with pytest.raises(SignatureError, match="expired"):
        TrustListVerifier(trust).verify(signed, LATER_MS)
    early = trust.with_key(entry.model_copy(update={"not_before_ms": NOW_MS + 1}))
    with pytest.raises(SignatureError, match="not valid before"):
        TrustListVerifier(early).verify(signed, NOW_MS)
    revoked = trust.with_key(entry.model_copy(update={"revoked_at_ms": NOW_MS}))
    with pytest.raises(SignatureError, match="revoked"):
        TrustListVerifier(revoked).verify(signed, NOW_MS)
    TrustListVerifier(revoked).verify(signed, NOW_MS - 1)


def test_trust_entries_are_checked() -> None:
    _, trust, _ = new_keyring(expires_at_ms=LATER_MS)
    entry = _entry(trust, KeyRole.COMMAND_SIGNER)
    other = _entry(trust, KeyRole.POLICY_PUBLISHER)
    body = entry.model_dump()
    with pytest.raises(ValueError, match="not the id of its public_key"):
        TrustedKey.model_validate({**body, "public_key": other.public_key})
    with pytest.raises(ValueError, match="pools are given for a pool-publisher key only"):
        TrustedKey.model_validate({**body, "pools": ["a100"]})
    confined = TrustedKey.model_validate({**other.model_dump(), "role": "pool-publisher",
                                          "pools": ["a100"]})
    assert confined.pools == ["a100"]
    with pytest.raises(ValueError, match="twice"):
        TrustList(keys=[entry, entry])


def test_trust_list_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    keyring, trust, _ = new_keyring(expires_at_ms=LATER_MS)
    path = tmp_path / "trust.json"
    source = TrustListFile(path)
    verifier = TrustListVerifier(source)
    signed = keyring.sign(_command())
    with pytest.raises(SignatureError, match="not in the trust list"):
        verifier.verify(signed, NOW_MS)  # no file yet: nothing is trusted
    write_trust_list(path, trust)
    verifier.verify(signed, NOW_MS)
    entry = _entry(trust, KeyRole.COMMAND_SIGNER)
    write_trust_list(path, trust.with_key(entry.model_copy(update={"revoked_at_ms": 1})))
    with pytest.raises(SignatureError, match="revoked"):
        verifier.verify(signed, NOW_MS)
    path.write_text("{not: [valid")  # a broken file leaves the last list read in force
    with pytest.raises(SignatureError, match="revoked"):
        verifier.verify(signed, NOW_MS)
    assert source.load_errors == 1


def test_yaml_trust_list(tmp_path: Path) -> None:
    _, trust, _ = new_keyring(expires_at_ms=LATER_MS)
    entry = _entry(trust, KeyRole.COMMAND_SIGNER)
    path = tmp_path / "trust.yaml"
    path.write_text(f"keys:\n  - key_id: {entry.key_id}\n    role: command-signer\n"
                    f"    public_key: {entry.public_key}\n    expires_at_ms: {LATER_MS}\n")
    assert read_trust_list(path).keys == [entry]


def test_key_file_signer_follows_a_replaced_key(tmp_path: Path) -> None:
    _, _, old = new_keyring((KeyRole.COMMAND_SIGNER,), expires_at_ms=LATER_MS)
    _, _, new = new_keyring((KeyRole.COMMAND_SIGNER,), expires_at_ms=LATER_MS)
    path = tmp_path / "command-signer.pem"
    write_private_key(path, old[KeyRole.COMMAND_SIGNER])
    assert os.stat(path).st_mode & 0o777 == 0o600
    with pytest.raises(FileExistsError):
        write_private_key(path, new[KeyRole.COMMAND_SIGNER])
    signer = KeyFileSigner(path)
    old_id = signer.key_id
    write_private_key(path, new[KeyRole.COMMAND_SIGNER], replace=True)
    assert signer.sign(_command()).signature.split(":")[1] != old_id
    assert signer.key_id == Ed25519Signer(new[KeyRole.COMMAND_SIGNER]).key_id


def test_zero_config_makes_one_keyring_per_data_folder(tmp_path: Path) -> None:
    settings = DsecSettings(data_dir=tmp_path / "dsec")
    verifier = verifier_for(settings)
    signed = signer_for(settings, KeyRole.COMMAND_SIGNER).sign(_command())
    assert verifier.verify(signed, NOW_MS).role is KeyRole.COMMAND_SIGNER
    keys_dir = tmp_path / "dsec" / "keys"
    assert {p.name for p in keys_dir.iterdir()} == {
        "command-signer.pem", "policy-publisher.pem", "pool-publisher.pem", "trust.json"}
    assert os.stat(keys_dir).st_mode & 0o777 == 0o700
    assert not make_keyring(keys_dir)  # made once
    with pytest.raises(SignatureError, match="no policy-publisher"):
        signer_for(settings, KeyRole.COMMAND_SIGNER).sign(_policy())
    both = signer_for(settings, KeyRole.COMMAND_SIGNER, also=[KeyRole.POLICY_PUBLISHER])
    assert verifier.verify(both.sign(_policy()), NOW_MS).role is KeyRole.POLICY_PUBLISHER


def test_a_configured_trust_list_makes_no_keys(tmp_path: Path) -> None:
    settings = DsecSettings(data_dir=tmp_path / "dsec", trust_list=tmp_path / "trust.json")
    verifier = verifier_for(settings)
    assert not (tmp_path / "dsec" / "keys").exists()
    keyring, _, _ = new_keyring(expires_at_ms=LATER_MS)
    with pytest.raises(SignatureError, match="not in the trust list"):
        verifier.verify(keyring.sign(_command()), NOW_MS)
    assert not key_path(tmp_path, KeyRole.COMMAND_SIGNER).exists()


def test_keys_cli_rotates_and_revokes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from typer.testing import CliRunner

    from dsec.cli import app

    monkeypatch.setenv("DSEC_DATA_DIR", str(tmp_path / "dsec"))
    runner = CliRunner()

    def keys(*args: str) -> str:
        result = runner.invoke(app, ["keys", *args])
        assert result.exit_code == 0, result.output
        return result.stdout

    def listed() -> dict[str, dict]:
        return {k["key_id"]: k for k in json.loads(keys("list", "--json"))["keys"]}

    keys("generate")
    assert runner.invoke(app, ["keys", "generate"]).exit_code == 1  # made once
    settings = DsecSettings(data_dir=tmp_path / "dsec")
    old = signer_for(settings, KeyRole.COMMAND_SIGNER)
    old_id = old.sign(_command()).signature.split(":")[1]
    assert runner.invoke(app, ["keys", "generate", "command-signer"]).exit_code == 1
    keys("generate", "command-signer", "--replace")
    new_id = old.sign(_command()).signature.split(":")[1]  # the file is read again
    assert new_id != old_id
    assert {listed()[k]["state"] for k in (old_id, new_id)} == {"valid"}  # the overlap
    keys("revoke", old_id)
    assert "revoked" in listed()[old_id]["state"] and listed()[new_id]["state"] == "valid"
    outsider = tmp_path / "team-a.pem"
    keys("generate", "pool-publisher", "--out", str(outsider), "--no-trust")
    refused = runner.invoke(app, ["keys", "trust", str(outsider), "--role", "policy-publisher",
                                  "--pools", "a100"])
    assert refused.exit_code == 2 and "pools" in refused.output
    keys("trust", str(outsider), "--role", "pool-publisher", "--pools", "a100,h100")
    assert ["a100", "h100"] in [k["pools"] for k in listed().values()]


def test_signing_bench_measures_each_side() -> None:
    from dsec.bench.signing import signing_costs

    costs = signing_costs(commands=100)
    assert costs["commands"] == 100
    assert all(value > 0 for name, value in costs.items() if name.endswith("_us"))


def test_a_verifier_makes_no_keys_and_reads_the_trust_list_once_it_is_made(
        tmp_path: Path) -> None:
    settings = DsecSettings(data_dir=tmp_path / "dsec")
    verifier = verifier_for(settings)  # a worker started before the engine
    assert not (tmp_path / "dsec" / "keys").exists()
    signed = signer_for(settings, KeyRole.COMMAND_SIGNER).sign(_command())
    assert verifier.verify(signed, NOW_MS).role is KeyRole.COMMAND_SIGNER
