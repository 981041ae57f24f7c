"""The stream jobs' Faust app: stream buffers survive a resume of flow that is already on,
and are emptied when flow comes back from a suspension (what they hold then belongs to the
assignment before); table changelogs get the configured replication factor."""

from __future__ import annotations

from mode.utils.queues import FlowControlQueue

from dsec.settings import DsecSettings
from dsec.stream_jobs.faust_app import ResumeKeepsBuffers, make_faust_app


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
