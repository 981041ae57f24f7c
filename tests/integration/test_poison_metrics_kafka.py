"""Issue 24's poison metric batches on the real broker and chDB, through a running stack:
each is dead-lettered with its reason, and the workers around it lose nothing.

The topics have one partition, so a poison message and the innocent worker's messages
around it reach the metrics job and the sink in the same batches."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from helpers import wait_for
from hostile_inputs import (
    DAY_MS,
    RunningStack,
    dated,
    episodes,
    huge_rewards,
    infinite_packed_reward,
    nested_lists,
    publish,
    rows,
    start_serving_stack,
)

from dsec.infra.topics import ensure_topics
from dsec.schemas import now_ms, topic_names
from dsec.schemas.settings import DsecSettings

pytestmark = pytest.mark.integration
TIMEOUT_S = 180


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[RunningStack]:
    data_dir = tmp_path_factory.mktemp("poison-stack")
    prefix = f"t{uuid.uuid4().hex[:10]}"
    ensure_topics(DsecSettings(bootstrap=kafka_bootstrap, topic_prefix=prefix), partitions=1)
    running = start_serving_stack(kafka_bootstrap, data_dir, prefix)
    try:
        yield running
    finally:
        running.stop()


def _metrics(stack: RunningStack, messages: list[tuple[str, bytes]]) -> None:
    publish(stack.settings, topic_names(stack.settings.topic_prefix).metrics,
            [(worker.encode(), value) for worker, value in messages])


def _dead_letter_reasons(stack: RunningStack, worker: str, count: int) -> list[str]:
    """The reasons of the dead letters whose payload names ``worker``, once there are
    ``count`` of them."""
    sql = f"SELECT reason FROM dead_letters WHERE payload LIKE '%\"{worker}\"%'"

    def enough() -> list | None:
        found = rows(stack.settings, sql)
        return found if len(found) >= count else None

    found = wait_for(enough, TIMEOUT_S, interval_s=1, what=f"{count} dead letters of {worker}")
    return sorted(reason for (reason,) in found)


def _stored_episodes(stack: RunningStack, worker: str) -> int:
    return rows(stack.settings,
                f"SELECT count() FROM raw_episode WHERE worker_id = '{worker}'")[0][0]


def _feature_events(stack: RunningStack, worker: str) -> int:
    return rows(stack.settings, "SELECT uniqExact(event_id) FROM features "
                                f"WHERE worker_id = '{worker}'")[0][0]


def test_nested_list_columns_are_dead_lettered_and_storage_goes_on(stack) -> None:
    """Was: the sink's thread died on ``[[1, 2], [3]]`` and nothing restarted it, so
    storage stopped for every worker."""
    _metrics(stack, [("nested", nested_lists("nested", ragged=True)),
                     ("nested", nested_lists("nested", ragged=False)),
                     *[("after-nested", episodes("after-nested", i)) for i in range(20)]])
    wait_for(lambda: _stored_episodes(stack, "after-nested") == 60, TIMEOUT_S, interval_s=1,
             what="the batches after the nested lists stored")
    reasons = _dead_letter_reasons(stack, "nested", 2)
    assert len(reasons) == 2
    assert all("columns.episode.reward: expected a list of" in r for r in reasons), reasons
    assert _stored_episodes(stack, "nested") == 0


def test_a_huge_reward_drops_only_its_own_message(stack) -> None:
    """Was: 1e308 made a feature event with non-finite values, the agent crashed with the
    batch acknowledged, and the features of an innocent worker's later messages in it
    were lost (160 of 240)."""
    messages = [("innocent", episodes("innocent", i)) for i in range(240)]
    messages.insert(80, ("huge-reward", huge_rewards("huge-reward")))
    messages.insert(160, ("inf-reward", infinite_packed_reward("inf-reward")))
    _metrics(stack, messages)
    wait_for(lambda: _feature_events(stack, "innocent") == 240, TIMEOUT_S, interval_s=1,
             what="features for every message of the innocent worker")
    huge = _dead_letter_reasons(stack, "huge-reward", 1)
    assert "non-finite features" in huge[0] and "reward_variance" in huge[0], huge
    infinite = _dead_letter_reasons(stack, "inf-reward", 1)
    assert "columns.episode.reward: values must be finite" in infinite[0], infinite
    assert _feature_events(stack, "huge-reward") == 0
    assert _stored_episodes(stack, "innocent") == 720


def test_samples_the_store_would_drop_are_dead_lettered(stack) -> None:
    """Was: a sample dated 1970 was accepted and then dropped by the table's TTL at insert,
    without a dead letter."""
    _metrics(stack, [("from-1970", dated("from-1970", 0, rows=False)),
                     ("from-1970-rows", dated("from-1970-rows", 0, rows=True)),
                     ("next-year", dated("next-year", now_ms() + 365 * DAY_MS, rows=True)),
                     ("after-dated", episodes("after-dated", 0))])
    wait_for(lambda: _stored_episodes(stack, "after-dated") == 3, TIMEOUT_S, interval_s=1,
             what="the batch after the dated ones stored")
    assert "columns.episode.event_time_ms: older than the store keeps" in (
        _dead_letter_reasons(stack, "from-1970", 1)[0])
    assert "samples.episode.event_time_ms: older than the store keeps" in (
        _dead_letter_reasons(stack, "from-1970-rows", 1)[0])
    assert "samples.episode.event_time_ms: more than 300 s in the future" in (
        _dead_letter_reasons(stack, "next-year", 1)[0])
    for worker in ("from-1970", "from-1970-rows", "next-year"):
        assert _stored_episodes(stack, worker) == 0


def test_a_batch_published_twice_is_counted_once_by_the_sink_and_the_features(stack) -> None:
    """Was: the sink skipped the second copy by batch id, the features counted it again
    (by offset)."""
    twice = episodes("twice", 0)
    _metrics(stack, [("twice", twice), ("twice", twice), ("twice", episodes("twice", 1))])
    wait_for(lambda: _stored_episodes(stack, "twice") == 6, TIMEOUT_S, interval_s=1,
             what="both batches stored")
    last = wait_for(lambda: rows(stack.settings, "SELECT max(value) FROM features WHERE "
                                                 "worker_id = 'twice' AND "
                                                 "feature = 'episodes_total'")[0][0] == 6,
                    TIMEOUT_S, interval_s=1, what="the features of both batches")
    assert last
    assert _feature_events(stack, "twice") == 2


def test_every_service_is_healthy_after_the_poison(stack) -> None:
    assert stack.health() == {service: 200 for service in stack.urls}
