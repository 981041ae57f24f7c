"""The stream jobs' Faust app: stream buffers survive a resume of flow that is already on,
and are emptied when flow comes back from a suspension (what they hold then belongs to the
assignment before); table changelogs get the configured replication factor; a partition whose
commits stand still with messages behind them is logged and fails the health check; after a
rebalance, what was fetched and dropped is fetched again, committed offset or not."""

from __future__ import annotations

from mode.utils.queues import FlowControlQueue

from dsec.infra.faust_app import (
    CommitStalls,
    ResumeKeepsBuffers,
    make_faust_app,
)
from dsec.schemas.settings import DsecSettings


def _buffer(flow: ResumeKeepsBuffers) -> FlowControlQueue:
    return FlowControlQueue(flow_control=flow, clear_on_resume=True)


def test_a_second_resume_keeps_what_was_fetched_after_the_first() -> None:
    flow = ResumeKeepsBuffers()  # suspended until the first assignment
    buffer = _buffer(flow)
    flow.resume()
    buffer.put_nowait("message fetched after the seek")
    flow.resume()  # recovery resumes again after its final seek
    assert flow.is_active()
    assert buffer.qsize() == 1


def test_resuming_after_a_suspension_empties_the_buffers() -> None:
    flow = ResumeKeepsBuffers()
    buffer = _buffer(flow)
    flow.resume()
    buffer.put_nowait("message of the revoked assignment")
    flow.suspend()
    assert not flow.is_active()
    flow.resume()
    assert flow.is_active()
    assert buffer.qsize() == 0


def test_table_changelogs_get_the_configured_replication_factor() -> None:
    app = make_faust_app("dsec-test", DsecSettings(replication_factor=3), partitions=6)
    assert app.conf.topic_replication_factor == 3
    assert isinstance(app.flow_control, ResumeKeepsBuffers)


TP = ("metrics", 0)


def test_commits_standing_still_with_messages_behind_are_logged_every_interval() -> None:
    stalls = CommitStalls(log_every_s=30)
    logged = [stalls.observe(TP, committed=None, end=60, paused=False, now_s=float(t))
              for t in range(0, 100, 5)]
    assert [t for t, stood in zip(range(0, 100, 5), logged, strict=True) if stood] == [30, 60, 90]
    assert [stood for stood in logged if stood] == [30.0, 60.0, 90.0]  # standing in all
    assert stalls.longest(now_s=95.0) == (TP, 95.0)


def test_moving_commits_paused_partitions_and_caught_up_ones_do_not_stand_still() -> None:
    stalls = CommitStalls(log_every_s=30)
    for t in range(0, 100, 5):
        assert stalls.observe(TP, committed=t, end=200, paused=False, now_s=t) is None
        assert stalls.observe(("metrics", 1), None, 60, paused=True, now_s=t) is None
        assert stalls.observe(("metrics", 2), 60, end=60, paused=False, now_s=t) is None
    assert stalls.longest(now_s=95.0)[1] == 0.0
    stalls.observe(TP, committed=95, end=200, paused=False, now_s=200.0)  # stands from 95 s
    stalls.keep_only({TP})
    assert stalls.longest(now_s=200.0) == (TP, 105.0)
    stalls.keep_only(set())  # revoked: forgotten
    assert stalls.longest(now_s=200.0) is None




def test_the_session_timeout_comes_from_the_settings() -> None:
    app = make_faust_app("dsec-test", DsecSettings(stream_session_timeout_s=8.0), partitions=1)
    assert app.conf.broker_session_timeout == 8.0
    default = make_faust_app("dsec-test", DsecSettings(), partitions=1)
    assert default.conf.broker_session_timeout == 60.0
