"""Feature batches as columns: decoded events and packed columns give the engine the same
batch, and the same commands; the memory writes each target's known features when it
first sees them, learns a name, or every ``persist_every_ms`` of event time."""

from __future__ import annotations

import numpy as np
from feature_values import HEALTHY
from keys import KEYRING, VERIFIER

from dsec.policy_engine.builtin import load_builtin_policies
from dsec.policy_engine.engine import Engine
from dsec.policy_engine.feature_batch import FeatureBatch, TargetSlots
from dsec.policy_engine.feature_memory import FeatureMemory, KnownFeatures
from dsec.policy_engine.registry import PolicyRegistry
from dsec.schemas import FeatureEvent, WorkerIdentity

WORKERS = 40


def _identity(i: int) -> WorkerIdentity:
    return WorkerIdentity(job_id="job", worker_id=f"w{i}", node_id=f"n{i // 8}")


def _features(i: int, second: int) -> dict[str, float]:
    features = dict(HEALTHY)
    if i % 5 == 0 and 20 <= second < 120:
        features["grad_sync_latency_p95_ms"] = 150.0  # the breaker trips, then clears
    if i % 7 == 0:
        del features["heartbeat_age_s"]
    return features


def _engine() -> Engine:
    registry = PolicyRegistry(VERIFIER)
    for policy in load_builtin_policies():
        registry.install_trusted(policy)
    return Engine(registry, {}, {}, KEYRING)


def test_events_become_columns_with_nan_where_not_carried() -> None:
    events = [FeatureEvent(identity=_identity(0), event_time_ms=5, features={"a": 1.0}),
              FeatureEvent(identity=_identity(1), event_time_ms=6, features={"b": 2.0},
                           tags={"pool": "p1"}, scope="pool")]
    batch = FeatureBatch.from_events(events)
    assert batch.targets == ["job|w0", "job|w1"]
    assert batch.event_times_ms.tolist() == [5, 6]
    assert np.isnan(batch.features["a"][1]) and batch.features["b"][1] == 2.0
    assert batch.pools == [None, "p1"] and batch.worker_scope.tolist() == [True, False]
    assert batch.event(1) is events[1]


def test_packed_columns_and_decoded_events_command_alike() -> None:
    from_events, from_columns = _engine(), _engine()
    commands: dict[str, list[str]] = {"events": [], "columns": []}
    for second in range(0, 300, 5):
        time_ms = 1_000_000 + second * 1000
        rows = [_features(i, second) for i in range(WORKERS)]
        events = [FeatureEvent(identity=_identity(i), event_time_ms=time_ms, features=f)
                  for i, f in enumerate(rows)]
        names = sorted({name for row in rows for name in row})
        columns = {name: np.array([row.get(name, np.nan) for row in rows]) for name in names}
        packed = FeatureBatch.packed(["job"] * WORKERS, [f"w{i}" for i in range(WORKERS)],
                                     [f"n{i // 8}" for i in range(WORKERS)],
                                     np.full(WORKERS, time_ms), columns)
        commands["events"] += [c.actuation_id for c in from_events.evaluate(events).commands]
        commands["columns"] += [c.actuation_id
                                for c in from_columns.evaluate_batch(packed).commands]
    assert len(commands["events"]) > WORKERS  # snapshots, breaker trips and undos
    assert commands["events"] == commands["columns"]


def _step_events(second: int) -> list[FeatureEvent]:
    return [FeatureEvent(identity=_identity(i), event_time_ms=1_000_000 + second * 1000,
                         features=_features(i, second)) for i in range(WORKERS)]


def test_a_backlog_in_one_batch_decides_as_its_steps_one_by_one() -> None:
    """A batch meeting each target many times (a backlog caught up on) is evaluated in
    passes that meet each target once: it commands and audits as the steps did, one batch
    each, with each target's later rows seeing the state its earlier rows left."""
    stepped, backlog = _engine(), _engine()
    seconds = range(0, 300, 5)
    by_step = [stepped.evaluate(_step_events(second)) for second in seconds]
    # 12 steps a batch, every worker in each; the last batch keeps a target's rows apart
    batches = [[event for second in seconds[start:start + 12] for event in _step_events(second)]
               for start in range(0, len(seconds), 12)]
    at_once = [backlog.evaluate(events) for events in batches]

    def key(out) -> tuple[list[str], list[tuple[str, str, int, str]]]:
        return (sorted(c.actuation_id for o in out for c in o.commands),
                sorted((d.policy_name, d.identity.worker_id if d.identity else "",
                        d.event_time_ms, d.decision.value) for o in out for d in o.decisions))

    commands, decisions = key(by_step)
    assert len(commands) > WORKERS  # snapshots, breaker trips and undos
    assert key(at_once) == (commands, decisions)
    assert backlog.states == stepped.states


def test_target_slots_are_stable_and_never_reused() -> None:
    slots = TargetSlots()
    assert slots.slots(["a", "b", "a"]).tolist() == [0, 1, 0]
    assert slots.slots(["c", "b"]).tolist() == [2, 1]
    assert slots.targets == ["a", "b", "c"]


def test_known_features_are_written_at_first_sight_on_a_new_name_and_then_every_interval(
) -> None:
    known: dict[str, KnownFeatures] = {}
    memory = FeatureMemory(known, persist_every_ms=30_000)

    def at(second: int, **features: float) -> None:
        event = FeatureEvent(identity=_identity(0), event_time_ms=second * 1000,
                             features=features)
        memory.view(FeatureBatch.from_events([event]), features)

    at(0, a=1.0)
    assert known["job|w0"] == KnownFeatures.of({"a": 1.0}, {"a": 0})
    at(10, a=2.0)
    assert known["job|w0"].values == {"a": 1.0}  # within the interval: not written
    at(20, b=3.0)  # a new name is written at once, with the value held
    assert known["job|w0"] == KnownFeatures.of({"a": 2.0, "b": 3.0}, {"a": 10_000, "b": 20_000})
    at(49, a=4.0)
    assert known["job|w0"].values["a"] == 2.0
    at(50, a=5.0)
    assert known["job|w0"].values == {"a": 5.0, "b": 3.0}
    # A restarted memory starts from what was written, with its times.
    again = FeatureMemory(known)
    view = again.view(FeatureBatch.from_events([FeatureEvent(
        identity=_identity(0), event_time_ms=51_000, features={"c": 1.0})]), ["a", "b"])
    assert view.values["a"].tolist() == [5.0] and view.times_ms["b"].tolist() == [20_000]


def test_an_event_with_no_features_is_remembered_as_knowing_nothing() -> None:
    known: dict[str, KnownFeatures] = {}
    memory = FeatureMemory(known)
    view = memory.view(FeatureBatch.from_events([FeatureEvent(
        identity=_identity(0), event_time_ms=1_000, features={})]), ["a"])
    assert np.isnan(view.values["a"][0]) and not view.fresh["a"][0]
    assert known["job|w0"] == KnownFeatures()
    assert not _engine().evaluate([FeatureEvent(identity=_identity(0), event_time_ms=1_000,
                                                features={})]).commands
