"""Last known values: a feature an event does not carry keeps its last value, with an age;
a policy may bound the age; a missing feature never makes a condition false."""

from __future__ import annotations

from dsec.policy_engine.feature_batch import FeatureBatch
from dsec.policy_engine.feature_memory import FeatureMemory, KnownFeatures
from dsec.policy_engine.tables import feature_table
from dsec.policy_engine.trace import replay
from dsec.schemas import FeatureEvent, PolicySpec, WorkerIdentity
from dsec.schemas.policies import DecisionKind

START_MS = 1_000_000
IDENTITY = WorkerIdentity(job_id="job", worker_id="w1", node_id="n1")


def _event(t_s: float, **features: float) -> FeatureEvent:
    return FeatureEvent(identity=IDENTITY, event_time_ms=START_MS + int(t_s * 1000),
                        features=features)


def _mixed_policy(**changes) -> PolicySpec:
    """Features from two sample kinds: the GPU's temperature and the sync latency."""
    return PolicySpec.model_validate({
        "name": "hot-and-slow", "condition":
            "gpu_temperature_c > 85.0 && grad_sync_latency_p95_ms > 100.0",
        "for_s": 10, "cooldown_s": 600, "action": {"params": {"kind": "snapshot"}},
        **changes})


def _interleaved(seconds: int, temperature_c: float = 90.0) -> list[FeatureEvent]:
    """GPU samples at even seconds, sync samples at odd ones: no event carries both."""
    events = []
    for t in range(seconds):
        if t % 2:
            events.append(_event(t, grad_sync_latency_p95_ms=150.0, grad_sync_bytes_per_s=1e6))
        else:
            events.append(_event(t, gpu_temperature_c=temperature_c))
    return events


def test_a_for_policy_over_features_of_two_sample_kinds_fires() -> None:
    result = replay([_mixed_policy()], _interleaved(30))
    fired = [d for d in result.output.decisions if d.decision is DecisionKind.FIRED]
    assert len(fired) == 1
    # The condition first held at t=1 (the first sync, with the temperature of t=0).
    assert fired[0].event_time_ms == START_MS + 11_000
    assert "gpu_temperature_c=90 (1 s old)" in fired[0].detail
    # Nothing reset the timer along the way; the cooldown after it is audited once.
    assert [d.decision for d in result.output.decisions[1:]] == [
        DecisionKind.SUPPRESSED_COOLDOWN]


def test_a_value_past_max_age_is_missing_and_leaves_the_state_as_it_was() -> None:
    policy = _mixed_policy(max_age_s=5)
    # The GPU stops reporting at t=4; syncs go on. Its last temperature grows old.
    events = [e for e in _interleaved(40) if e.event_time_ms <= START_MS + 4_000
              or "gpu_temperature_c" not in e.features]
    result = replay([policy], events)
    assert not result.output.decisions
    pending = result.states["hot-and-slow|job|w1"]
    assert pending.pending_since_ms == START_MS + 1_000  # kept, not reset
    # A fresh reading after the gap fires at once: the timer ran since t=1.
    late = replay([policy], [*events, _event(41, gpu_temperature_c=91.0)])
    fired = [d for d in late.output.decisions if d.decision is DecisionKind.FIRED]
    assert [d.event_time_ms for d in fired] == [START_MS + 41_000]


def test_a_missing_feature_does_not_make_a_condition_false() -> None:
    policy = PolicySpec.model_validate({
        "name": "either", "condition": "gpu_temperature_c > 85.0 || worker_lost >= 1.0",
        "for_s": 4, "cooldown_s": 600, "action": {"params": {"kind": "snapshot"}}})
    # worker_lost never reported: `true || error` holds; `false || error` is not told.
    events = [_event(0, gpu_temperature_c=90.0), _event(2, gpu_temperature_c=80.0),
              _event(4, gpu_temperature_c=90.0), _event(6, gpu_temperature_c=90.0)]
    result = replay([policy], events)
    # t=2 was not told, so it reset nothing: the 4 s ran from t=0 (a reset: t=8).
    fired = [d for d in result.output.decisions if d.decision is DecisionKind.FIRED]
    assert [d.event_time_ms for d in fired] == [START_MS + 4_000]


def test_suppressed_records_stay_few_when_features_arrive_apart() -> None:
    policy = _mixed_policy(for_s=0, cooldown_s=300)
    # Ten minutes of a worker hot and slow, GPU and sync samples in separate events.
    result = replay([policy], _interleaved(600))
    kinds = [d.decision for d in result.output.decisions]
    assert kinds.count(DecisionKind.FIRED) == 2  # t=1 and after the 300 s cooldown
    assert kinds.count(DecisionKind.SUPPRESSED_COOLDOWN) <= 2


def test_out_of_order_events_do_not_replace_newer_values() -> None:
    memory = FeatureMemory({})
    target = "job|w1"
    batch = FeatureBatch.from_events([_event(5, gpu_temperature_c=70.0),
                                      _event(3, gpu_temperature_c=99.0)])
    view = memory.view(batch, {"gpu_temperature_c"})
    assert view.values["gpu_temperature_c"].tolist() == [70.0, 70.0]
    assert memory.known[target].times_ms == {"gpu_temperature_c": START_MS + 5_000}


def test_known_features_round_trip_through_table_bytes() -> None:
    table: dict[bytes, bytes] = {}
    known = feature_table(table)
    known["job|w1"] = KnownFeatures.of({"a": 1.5, "b": 2.0}, {"a": 10, "b": 12})
    assert list(table) == [b"w1"]
    assert feature_table(table)["job|w1"] == known["job|w1"]


def test_known_features_written_in_the_earlier_form_still_read() -> None:
    table = {b"w1": b'{"job|w1": {"a": [1.5, 10], "b": [2.0, 12]}}'}
    assert feature_table(table)["job|w1"] == KnownFeatures.of({"a": 1.5, "b": 2.0},
                                                              {"a": 10, "b": 12})
    assert KnownFeatures.from_json(KnownFeatures().to_json()) == KnownFeatures()


def test_a_restarted_engine_keeps_what_it_knew() -> None:
    # The memory outlives the engine (a table): the GPU value seen before the restart
    # completes the condition after it.
    policy = _mixed_policy(for_s=0)
    memory: dict[str, KnownFeatures] = {}
    first = replay([policy], [_event(0, gpu_temperature_c=90.0)], known=memory)
    assert not first.output.commands
    second = replay([policy], [_event(1, grad_sync_latency_p95_ms=150.0)], known=memory)
    assert len(second.output.commands) == 1


def _memory_view(memory: FeatureMemory, t_s: float, **features: float) -> dict[str, float]:
    view = memory.view(FeatureBatch.from_events([_event(t_s, **features)]), {"a", "b"})
    return {name: float(column[0]) for name, column in view.values.items()}


def test_a_target_is_written_at_first_sight_on_a_new_name_and_then_once_an_interval() -> None:
    memory = FeatureMemory({}, persist_every_ms=30_000)
    target = "job|w1"
    _memory_view(memory, 0, a=1.0)
    assert memory.known[target].values == {"a": 1.0}
    _memory_view(memory, 1, a=2.0)  # nothing new, and not yet due
    assert memory.known[target].values == {"a": 1.0}
    _memory_view(memory, 2, b=3.0)  # a name it did not know
    assert memory.known[target].values == {"a": 2.0, "b": 3.0}
    _memory_view(memory, 20, a=4.0)
    assert memory.known[target].values == {"a": 2.0, "b": 3.0}
    _memory_view(memory, 33, a=5.0)  # 31 s after the last write
    assert memory.known[target].values == {"a": 5.0, "b": 3.0}
    assert memory.known[target].times_ms == {"a": START_MS + 33_000, "b": START_MS + 2_000}


def test_a_feature_not_reported_for_a_day_is_forgotten() -> None:
    memory = FeatureMemory({})
    target = "job|w1"
    day_s = 24 * 3600
    assert _memory_view(memory, 0, a=1.0, b=2.0) == {"a": 1.0, "b": 2.0}
    assert _memory_view(memory, day_s + 3600, b=3.0) == {"a": 1.0, "b": 3.0}
    assert memory.known[target].values == {"b": 3.0}  # forgotten, and written so at once
    seen = _memory_view(memory, day_s + 3601, b=4.0)
    assert seen["b"] == 4.0 and seen["a"] != seen["a"]  # a is missing (NaN)
    assert _memory_view(memory, day_s + 3602, a=6.0)["a"] == 6.0  # and known again
    assert memory.known[target].values == {"a": 6.0, "b": 4.0}


def test_a_memory_reads_back_what_it_wrote_for_many_targets_at_once() -> None:
    # Targets knowing different names, and one that knows none, read back at first sight
    # by a new memory over the same mapping: the same values and ages, nothing rewritten.
    written: dict[str, KnownFeatures] = {}
    first = FeatureMemory(written)
    events = [FeatureEvent(identity=WorkerIdentity(job_id="job", worker_id=f"w{i}",
                                                   node_id="n1"),
                           event_time_ms=START_MS + i, features=(
                               {"a": float(i)} if i % 3 == 0 else
                               {"a": float(i), "b": -float(i)} if i % 3 == 1 else {}))
              for i in range(30)]
    first.view(FeatureBatch.from_events(events), {"a", "b"})
    assert len(written) == 30
    copy = dict(written)
    later = [FeatureEvent(identity=e.identity, event_time_ms=START_MS + 1_000, features={})
             for e in events]
    view = FeatureMemory(written).view(FeatureBatch.from_events(later), {"a", "b"})
    for i in range(30):
        assert copy[f"job|w{i}"] is written[f"job|w{i}"]  # not due: not rewritten
        a, b = view.values["a"][i], view.values["b"][i]
        assert (a == float(i)) if i % 3 != 2 else a != a
        assert (b == -float(i)) if i % 3 == 1 else b != b
        if i % 3 != 2:
            assert view.times_ms["a"][i] == START_MS + i
