"""Feature events, stored events, actuation commands and results, and worker-channel
frames from the wire, fuzzed: each is decoded or refused with its documented error naming
the field, and what decodes is stored, evaluated or gated without raising."""

from __future__ import annotations

import pytest
from fuzzing import fuzz
from hypothesis import given
from hypothesis import strategies as st

from dsec.bench.fuzz_inputs import (
    command_documents,
    dead_letter_documents,
    decision_documents,
    feature_event_documents,
    frame_documents,
    gpu_profile_documents,
    result_documents,
    wire,
)
from dsec.bench.fuzz_targets import (
    actuation_command,
    actuation_result,
    channel_frame,
    feature_event,
    stored_event,
)
from dsec.schemas import DeadLetter, GpuProfileEvent, PolicyDecision


@fuzz(200)
@given(wire(feature_event_documents()))
def test_feature_events_are_finite_or_refused_and_evaluate(data: bytes) -> None:
    feature_event(data)


@fuzz(200)
@given(wire(command_documents()))
def test_commands_are_decoded_or_refused_and_gated_without_raising(data: bytes) -> None:
    actuation_command(data)


@fuzz(150)
@given(wire(result_documents()))
def test_results_are_decoded_or_refused_and_stored_without_raising(data: bytes) -> None:
    actuation_result(data)


@fuzz(150)
@given(wire(frame_documents()))
def test_worker_channel_frames_are_frames_or_channel_errors(data: bytes) -> None:
    channel_frame(data)


@pytest.mark.parametrize("model, documents", [
    (GpuProfileEvent, gpu_profile_documents()), (PolicyDecision, decision_documents()),
    (DeadLetter, dead_letter_documents())], ids=["gpu-profile", "decision", "dead-letter"])
@fuzz(80)
@given(data=st.data())
def test_every_other_topic_the_sink_stores_is_decoded_or_refused(model, documents,
                                                                  data) -> None:
    stored_event(model, data.draw(wire(documents)))
