"""Issue 24's poison policies on the real broker, against the policy engine in its own
process: records already on the policies topic when it starts, and records published
while it runs. Each is refused and audited; none stops the engine or deletes a policy;
every policy is bounded by the cooldown floor and every worker by the command cap."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from feature_values import HEALTHY
from policy_broker import EngineProcess, Rig, env_for, trace

from dsec.infra.keys import signer_for
from dsec.infra.topics import ensure_topics
from dsec.schemas import PolicySpec, encode, now_ms
from dsec.schemas.policies import DecisionKind
from dsec.schemas.settings import DsecSettings
from dsec.schemas.trust import KeyRole

pytestmark = pytest.mark.integration
COMMAND_CAP = 4  # DSEC_COMMANDS_PER_WORKER_PER_MIN of the engine under test
SILENT = {**HEALTHY, "heartbeat_age_s": 60.0}  # the periodic snapshot leaves it alone


def _policy(name: str, **changes: object) -> PolicySpec:
    return PolicySpec.model_validate({
        "name": name, "version": 1, "condition": "gpu_temperature_c > 90.0",
        "cooldown_s": 600, "action": {"params": {"kind": "snapshot"}}, **changes})


DEEP = "(" * 150 + "gpu_temperature_c > 90.0" + ")" * 150


@pytest.fixture(scope="module")
def rig(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """The engine started on a policies topic that already holds a signed policy nested
    150 deep, and a signed policy followed by an unsigned tombstone of it."""
    data_dir = tmp_path_factory.mktemp("poison-policies")
    settings = DsecSettings(bootstrap=kafka_bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}",
                            job_id="test-job", data_dir=data_dir)
    ensure_topics(settings)
    rig = Rig(settings)
    key = signer_for(settings, KeyRole.POLICY_PUBLISHER)
    rig.raw_policy(b"deep", encode(key.sign(_policy("deep", condition=DEEP))))
    rig.raw_policy(b"custom", encode(key.sign(_policy("custom"))))
    rig.raw_policy(b"custom", None)
    log_path = data_dir / "engine.log"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DSEC_COMMANDS_PER_WORKER_PER_MIN", str(COMMAND_CAP))
        rig.engine = EngineProcess(settings, log_path).start()
    try:
        rig.decisions.wait(lambda items: not rig.engine.alive() or any(
            d.decision is DecisionKind.POLICY_ACCEPTED for d in items), 120, "the engine")
        assert rig.engine.alive(), log_path.read_text()[-3000:]
        yield rig
    finally:
        rig.engine.stop()
        rig.close()
        print(log_path.read_text()[-3000:])


def _rejections(rig: Rig, names: set[str]) -> dict[str, str]:
    """The audited rejection of each policy in ``names``, once all are there."""
    def found(items) -> dict[str, str] | None:
        rejected = {d.policy_name: d.detail for d in items
                    if d.decision is DecisionKind.POLICY_REJECTED and d.policy_name in names}
        return rejected if rejected.keys() == names else None

    return rig.decisions.wait(found, 60, f"rejections of {sorted(names)}")


def _policy_cli(rig: Rig, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsec.cli", "policy", *args],
                          env=env_for(rig.settings), capture_output=True, text=True, timeout=90)


def test_a_policy_nested_150_deep_is_refused_and_the_stack_still_starts(rig) -> None:
    """Was: RecursionError in the compiler, not caught; ``dsec up`` and ``dsec policy
    list`` failed at start for as long as the record stayed on the topic."""
    key = signer_for(rig.settings, KeyRole.POLICY_PUBLISHER)
    rig.raw_policy(b"deep-later", encode(key.sign(_policy("deep-later", condition=DEEP))))
    reasons = _rejections(rig, {"deep", "deep-later"})
    assert all("nested 151 deep" in reason for reason in reasons.values()), reasons
    assert rig.engine.alive()
    listed = _policy_cli(rig, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "nested 151 deep" in json.loads(listed.stdout)["rejected"]["deep"]


def test_an_unsigned_tombstone_deletes_nothing_and_is_audited(rig) -> None:
    """Was: a tombstone without a signature deleted any policy, built-ins included."""
    rig.raw_policy(b"reward-variance-jump", None)
    reasons = _rejections(rig, {"custom", "reward-variance-jump"})
    assert all("unsigned tombstone" in reason for reason in reasons.values()), reasons
    rig.send(trace({**SILENT, "gpu_temperature_c": 95.0}, 5, "hot", now_ms())
             + trace({**SILENT, "reward_volatility_chance_per_h": 1e-4}, 5, "jumpy", now_ms()))
    rig.commands.wait(lambda items: {c.policy_name for c in items} >= {
        "custom", "reward-variance-jump"}, 60, "both policies still acting")
    listed = json.loads(_policy_cli(rig, "list", "--json").stdout)
    assert {"custom", "reward-variance-jump"} <= {p["name"] for p in listed["policies"]}


def test_policies_over_unknown_features_or_functions_are_refused_at_publish(rig, tmp_path
                                                                            ) -> None:
    """Was: accepted, never fired, and nothing audited."""
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("name: unknown-feature\ncondition: not_a_feature > 1.0\n"
                       "action: {params: {kind: snapshot}}\n")
    refused = _policy_cli(rig, "publish", str(unknown))
    assert refused.returncode == 2 and "unknown features not_a_feature" in refused.stderr
    # signed and written past the CLI's check
    key = signer_for(rig.settings, KeyRole.POLICY_PUBLISHER)
    rig.raw_policy(b"unknown-feature", encode(key.sign(_policy(
        "unknown-feature", condition="not_a_feature > 1.0"))))
    rig.raw_policy(b"unknown-function", encode(key.sign(_policy(
        "unknown-function", condition="undefined_fn(gpu_temperature_c) > 1.0"))))
    reasons = _rejections(rig, {"unknown-feature", "unknown-function"})
    assert "unknown features not_a_feature" in reasons["unknown-feature"]
    assert "unknown or unbounded CEL functions undefined_fn" in reasons["unknown-function"]


def test_cooldowns_have_a_floor_and_workers_a_command_cap(rig) -> None:
    """Was: a signed "snapshot every worker continuously" policy ran (152 snapshots in
    30 s to one worker)."""
    key = signer_for(rig.settings, KeyRole.POLICY_PUBLISHER)
    rig.raw_policy(b"snapshot-everyone", encode(key.sign(_policy(
        "snapshot-everyone", condition="heartbeat_age_s >= 0.0", cooldown_s=0,
        selector={"job_ids": ["rate-job"]}))))
    rig.decisions.wait(lambda items: any(
        d.policy_name == "snapshot-everyone" and d.decision is DecisionKind.POLICY_ACCEPTED
        for d in items), 60, "the policy running")
    start = now_ms() - 600_000
    events = trace(SILENT, 25, "brief", start, step_s=1) + trace(SILENT, 120, "long", start,
                                                                 step_s=1)
    rig.send([e.model_copy(update={"identity": e.identity.model_copy(
        update={"job_id": "rate-job"})}) for e in events])

    def settled(items) -> bool:
        done = [d for d in items if d.identity and d.identity.worker_id in ("brief", "long")
                and d.event_time_ms >= start + 110_000]
        return bool(done)

    decisions = rig.decisions.wait(settled, 60, "the long worker's last decisions")
    commands = [c for c in rig.commands.drain(2.0) if c.target.job_id == "rate-job"]
    brief = sorted(c.event_time_ms - start for c in commands if c.target.worker_id == "brief")
    assert brief == [0, 10_000, 20_000]  # the floor: 10 s, whatever cooldown_s says
    long = sorted(c.event_time_ms - start for c in commands if c.target.worker_id == "long")
    assert long == [0, 10_000, 20_000, 30_000, 60_000, 70_000, 80_000, 90_000]
    assert all(sum(1 for t in long if at <= t < at + 60_000) <= COMMAND_CAP for at in long)
    capped = sorted(d.event_time_ms - start for d in decisions
                    if d.decision is DecisionKind.SUPPRESSED_RATE_LIMIT
                    and d.identity.worker_id == "long")
    assert capped == [40_000, 50_000, 100_000, 110_000]
