"""The rule every decoder of wire bytes keeps, as one check per decoder.

Whatever the bytes, a decoder returns what it decoded or refuses them with its documented
error, which names the field at fault; it raises nothing else, and what it accepts goes
through the stages after it without raising. A check takes the bytes as they arrive and
raises ``FuzzFinding`` where the rule is broken. The property tests (hypothesis) and
``dsec bench fuzz`` (atheris) drive the same checks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import orjson
from pydantic import BaseModel, ValidationError

from dsec.actuators.channel import ChannelError, decode_frame
from dsec.actuators.gate import CommandGate, node_target, out_of_bounds_result
from dsec.infra.records import Record
from dsec.infra.store import rows
from dsec.infra.store.raw_columns import RawColumnsBuilder
from dsec.ingest.json_body import BodyError, parse_strict
from dsec.policy_engine.engine import Engine
from dsec.policy_engine.registry import (
    PolicyRegistry,
    PolicyRejected,
    compile_policy,
    parse_record,
)
from dsec.schemas import (
    ActuationCommand,
    ActuationResult,
    DeadLetter,
    DecodeError,
    FeatureEvent,
    GpuProfileEvent,
    MetricBatch,
    PolicyDecision,
    PolicySpec,
    RuntimeMetricsPost,
    RuntimeRegistration,
    WorkerIdentity,
    decode,
)
from dsec.schemas.event_times import EventTimeWindow
from dsec.schemas.fast_decode import DecodedBatch, decode_metric_batch
from dsec.schemas.feature_columns import decode_features
from dsec.schemas.features import WORKER_FEATURES
from dsec.schemas.frames import Frame, batch_frames
from dsec.schemas.signing import HmacSigner, HmacVerifier
from dsec.schemas.topics import topic_names
from dsec.stream_jobs.metrics_job import MetricsJob

# Fuzzing is about the inputs, not the keys: the hmac-dev pair, fast and role-free.
SIGNER = HmacSigner(b"fuzz-signing-key")
VERIFIER = HmacVerifier(SIGNER.key)
NOW_MS = 1_800_000_000_000  # the clock of the checks that need one (2027-01-15)
WINDOW = EventTimeWindow()
SLOW_S = 5.0  # one input taking this much CPU time to decode counts as a hang
GATEWAY_JSON_DEPTH = 32
T = TypeVar("T")


class FuzzFinding(AssertionError):
    """A decoder broke the rule on ``data``: ``problem`` says how."""

    def __init__(self, target: str, problem: str, data: bytes | Sequence[bytes]) -> None:
        super().__init__(f"{target}: {problem}")
        self.target = target
        self.problem = problem
        self.data = data


def prepare() -> None:
    """What the checks need done once, before a fuzzer watches them: cel-python raises the
    interpreter's recursion limit the first time it is used (hypothesis warns when it
    sees the limit change under a test)."""
    import celpy

    celpy.Environment()


def _outcome(target: str, data: Any, call: Callable[[], T],
             refusals: tuple[type[Exception], ...]) -> T | Exception:
    """What ``call`` returned, or the documented refusal it raised; anything else it
    raises, and a call that takes over ``SLOW_S`` of this thread's CPU time (not wall
    time, which a loaded machine stretches), is a finding."""
    started_s = time.thread_time()
    try:
        result: T | Exception = call()
    except refusals as exc:
        result = exc
    except Exception as exc:
        raise FuzzFinding(target, f"raised {type(exc).__name__}: {exc}", data) from exc
    elapsed_s = time.thread_time() - started_s
    if elapsed_s > SLOW_S:
        raise FuzzFinding(target, f"took {elapsed_s:.1f} s of CPU", data)
    return result


def _verdict(outcome: object) -> str:
    return f"refused ({outcome})" if isinstance(outcome, Exception) else "accepted"


def _named(target: str, data: Any, reason: str, prefixes: tuple[str, ...]) -> None:
    if not reason.startswith(prefixes):
        raise FuzzFinding(target, f"refused without naming what: {reason[:200]!r}", data)


# --- metric batches ---------------------------------------------------------------------------


def _same_frames(fast: dict[str, Frame], reference: dict[str, Frame]) -> str | None:
    """Where the column decoder's frames differ from the reference's (kinds without
    samples aside), or None."""
    fast, reference = ({kind: frame for kind, frame in frames.items()
                        if frame["event_time_ms"].size} for frames in (fast, reference))
    if fast.keys() != reference.keys():
        return f"kinds {sorted(fast)} != {sorted(reference)}"
    for kind, frame in reference.items():
        for name, column in frame.items():
            got = fast[kind].get(name)
            if got is None or got.dtype != column.dtype:
                return f"{kind}.{name}: {None if got is None else got.dtype} != {column.dtype}"
            if column.dtype == object:
                same = got.tolist() == column.tolist()
            else:
                same = np.array_equal(got, column, equal_nan=column.dtype.kind == "f")
            if not same:
                return f"{kind}.{name}: {got.tolist()[:4]} != {column.tolist()[:4]}"
    return None


def _reference(data: bytes) -> MetricBatch:
    """The pydantic models on strict JSON (RFC 8259, as the gateway reads it): pydantic's
    own parser takes more (a number that overflows, where a later duplicate key replaces
    it), which no dsec consumer reads."""
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"invalid MetricBatch: not JSON: {exc}") from None
    return decode(data, MetricBatch)


def _decoded(data: bytes, target: str = "metric-batch") -> DecodedBatch | None:
    """The batch as the stream jobs decode it, once checked against the pydantic models."""
    fast = _outcome(target, data, lambda: decode_metric_batch(data), (DecodeError,))
    reference = _outcome(target, data, lambda: _reference(data), (DecodeError,))
    windowed = _outcome(target, data, lambda: decode_metric_batch(data, WINDOW, NOW_MS),
                        (DecodeError,))
    for refused in (fast, reference, windowed):
        if isinstance(refused, DecodeError):
            _named(target, data, refused.reason, ("invalid MetricBatch: ", "empty message"))
    if isinstance(fast, DecodeError) != isinstance(reference, DecodeError):
        verdicts = [f"{name} {_verdict(outcome)}" for name, outcome in
                    (("the column decoder", fast), ("the pydantic models", reference))]
        raise FuzzFinding(target, f"disagree: {'; '.join(verdicts)}", data)
    if isinstance(fast, DecodeError):
        return None
    assert isinstance(reference, MetricBatch)
    header = fast.header
    given = orjson.loads(data)  # the defaults (a new id, the clock) differ between decodes
    for field in ("schema_version", "event_id", "event_time_ms", "identity", "gpu_uuid"):
        if field in given and getattr(header, field) != getattr(reference, field):
            raise FuzzFinding(target, f"header {field} differs from the pydantic model's", data)
    difference = _same_frames(fast.frames, batch_frames(reference))
    if difference is not None:
        raise FuzzFinding(target, f"frames differ from the pydantic model's: {difference}", data)
    if not isinstance(windowed, DecodeError) and _same_frames(windowed.frames, fast.frames):
        raise FuzzFinding(target, "the event-time window changed what was decoded", data)
    return fast if isinstance(windowed, DecodeError) else windowed


def _stored(target: str, data: Any, decoded: DecodedBatch) -> None:
    """The sink's part: one Arrow table per raw table, from what the decoder accepted."""
    def build() -> None:
        builder = RawColumnsBuilder()
        builder.add(decoded.header, decoded.frames)
        builder.tables()

    _outcome(target, data, build, ())


def _through_the_metrics_job(target: str, data: Any, messages: Sequence[bytes]) -> None:
    """The metrics job's part: one worker's messages in two batches, the state saved in
    between; nothing raised, every output encodable for the producer, and every message
    of features (columns, built unvalidated) valid for its consumers."""
    job = MetricsJob(topic_names("fuzz"), {}, clock_ms=lambda: NOW_MS)
    records = [Record(job.topics.metrics, 0, offset, b"worker", value)
               for offset, value in enumerate(messages)]
    half = (len(records) + 1) // 2
    for part in (records[:half], records[half:]):
        if not part:
            continue
        result = _outcome(target, data, lambda part=part: job.process(part, NOW_MS), ())
        for output in result.outputs:
            value = _outcome(target, data, output.value, ())
            if output.topic == job.topics.features:
                _outcome(target, data, lambda value=value: decode_features(value), ())
        job.save(result.states)


def metric_batch(data: bytes) -> None:
    """``decode_metric_batch`` (rows, columns, packed columns) against the pydantic
    models, then the sink's tables from what it accepted, and the metrics job."""
    decoded = _decoded(data)
    if decoded is not None:
        _stored("metric-batch", data, decoded)
    _through_the_metrics_job("metric-batch", data, [data])


def metric_stream(messages: Sequence[bytes]) -> None:
    """One worker's messages in order: each decoded alike by both decoders, and the
    features of each from the state the ones before it left."""
    for data in messages:
        _decoded(data, "metric-stream")
    _through_the_metrics_job("metric-stream", messages, messages)


# --- what the sink stores and the policy engine reads ----------------------------------------

STORED: dict[type[BaseModel], Callable[[Any], list]] = {
    FeatureEvent: rows.feature_rows,
    GpuProfileEvent: rows.gpu_profile_rows,
    ActuationCommand: rows.actuation_rows,
    ActuationResult: rows.result_rows,
    PolicyDecision: rows.decision_rows,
    DeadLetter: rows.dead_letter_rows,
}


def stored_event(model: type[BaseModel], data: bytes) -> BaseModel | None:
    """``decode`` of one of the sink's topics, and the rows of what it accepted."""
    target = model.__name__
    event = _outcome(target, data, lambda: decode(data, model), (DecodeError,))
    if isinstance(event, DecodeError):
        _named(target, data, event.reason, (f"invalid {target}: ", "empty message"))
        return None
    _outcome(target, data, lambda: STORED[model](event), ())
    return event


_ENGINE_REGISTRY: PolicyRegistry | None = None


def _builtin_registry() -> PolicyRegistry:
    global _ENGINE_REGISTRY
    if _ENGINE_REGISTRY is None:
        from dsec.policy_engine.builtin import load_builtin_policies

        _ENGINE_REGISTRY = PolicyRegistry(VERIFIER)
        for policy in load_builtin_policies():
            _ENGINE_REGISTRY.install_trusted(policy)
    return _ENGINE_REGISTRY


def feature_event(data: bytes) -> None:
    """A feature event as the sink and the policy engine read it: only finite features,
    and the built-in pack evaluates it without raising."""
    event = stored_event(FeatureEvent, data)
    if event is None:
        return
    assert isinstance(event, FeatureEvent)
    if not all(math.isfinite(value) for value in event.features.values()):
        raise FuzzFinding("FeatureEvent", "accepted a non-finite feature", data)
    engine = Engine(_builtin_registry(), {}, {}, SIGNER)
    _outcome("FeatureEvent", data, lambda: engine.evaluate([event]), ())


# --- policies ------------------------------------------------------------------------------------

_HOT = {name: 1e300 for name in WORKER_FEATURES}
_COLD = {name: -1e300 for name in WORKER_FEATURES}


def policy_record(data: bytes) -> None:
    """A record of the policies topic: the registry audits it whatever it holds, and a
    policy it accepts, signed, compiles or is refused, and then evaluates."""
    target = "policy"
    decision = _outcome(target, data, lambda: PolicyRegistry(VERIFIER).offer(b"fuzz", data), ())
    if decision is not None and not isinstance(decision, PolicyDecision):
        raise FuzzFinding(target, f"offer returned {type(decision).__name__}", data)
    record = _outcome(target, data, lambda: parse_record(data), (PolicyRejected,))
    if not isinstance(record, PolicySpec):
        return
    registry = PolicyRegistry(VERIFIER)
    signed = _outcome(target, data, lambda: SIGNER.sign(record), ())
    installed = _outcome(target, data, lambda: registry.install(signed), ())
    compiled = _outcome(target, data, lambda: compile_policy(record), (PolicyRejected,))
    accepted = installed is not None and installed.decision == "policy_accepted"
    if accepted == isinstance(compiled, PolicyRejected):
        raise FuzzFinding(target, "install and compile_policy disagree", data)
    if not accepted:
        return
    identity = WorkerIdentity(job_id="j", worker_id="w", node_id="n")
    events = [FeatureEvent(identity=identity, event_time_ms=NOW_MS + i * 1000,
                           features=features)
              for i, features in enumerate((_HOT, _COLD, {}, _HOT))]
    engine = Engine(registry, {}, {}, SIGNER)
    _outcome(target, data, lambda: engine.evaluate(events), ())


# --- actuation commands and results, and the worker channel ----------------------------------


def actuation_command(data: bytes) -> None:
    """A command as an actuator reads it: decoded or refused, its rejection reported from
    its envelope when it names a target, and the gate's verdict on what decoded."""
    command = stored_event(ActuationCommand, data)
    result = _outcome("ActuationCommand", data, lambda: out_of_bounds_result(data, "fuzz"), ())
    if result is not None and not isinstance(result, ActuationResult):
        raise FuzzFinding("ActuationCommand", "out_of_bounds_result gave no result", data)
    if command is None:
        return
    assert isinstance(command, ActuationCommand)
    gate = CommandGate(None, VERIFIER, addressed=node_target(command.target.node_id))
    for now_ms in (command.event_time_ms, NOW_MS):
        _outcome("ActuationCommand", data, lambda now_ms=now_ms: gate.check(command, now_ms), ())


def actuation_result(data: bytes) -> None:
    stored_event(ActuationResult, data)


def channel_frame(data: bytes) -> None:
    """A frame off the worker channel's socket: a frame, or ``ChannelError``."""
    _outcome("channel-frame", data, lambda: decode_frame(data), (ChannelError,))


# --- the ingest gateway's JSON bodies -------------------------------------------------------

_BODY_CODES = frozenset({"invalid_json", "too_deep", "too_large"})


def gateway_body(data: bytes) -> None:
    """A request body as the gateway reads it: strict JSON within the depth limit, then
    each of its models, refusing with the field named."""
    target = "gateway-body"
    parsed = _outcome(target, data, lambda: parse_strict(data, GATEWAY_JSON_DEPTH), (BodyError,))
    if isinstance(parsed, BodyError):
        if parsed.code not in _BODY_CODES:
            raise FuzzFinding(target, f"unknown body error code {parsed.code!r}", data)
        return
    for model in (RuntimeRegistration, RuntimeMetricsPost):
        outcome = _outcome(target, data, lambda model=model: model.model_validate_json(data),
                           (ValidationError,))
        if isinstance(outcome, ValidationError) and not all(
                error["loc"] or error["type"] in ("model_type", "json_invalid")
                for error in outcome.errors()):
            raise FuzzFinding(target, f"{model.__name__} refused without a field", data)


TARGETS: dict[str, Callable[[bytes], None]] = {
    "metric-batch": metric_batch,
    "feature-event": feature_event,
    "policy": policy_record,
    "actuation-command": actuation_command,
    "actuation-result": actuation_result,
    "channel-frame": channel_frame,
    "gateway-body": gateway_body,
}
