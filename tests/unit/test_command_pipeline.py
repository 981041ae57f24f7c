"""The one command pipeline without a broker: CommandSource on the consumer double, the
gate, the appliers and the results, as the in-process actuator, the node actuator and the
webhook forwarder use them. The same on the real broker: tests/integration/
test_command_flood_kafka.py."""

from __future__ import annotations

import uuid

import orjson
from consumer_double import InMemoryLog, InMemoryMessage
from helpers import wait_for
from keys import FORGER, KEYRING, VERIFIER

from dsec.actuators import ApplyHooks
from dsec.actuators.command_source import CommandSource, dead_letters_to
from dsec.actuators.gate import CommandGate
from dsec.actuators.in_process import HookApplier, InProcessActuator
from dsec.actuators.pipeline import DUPLICATE_DETAIL, Applier, CommandPipeline, Outcome
from dsec.actuators.results import ResultPublisher
from dsec.actuators.webhooks import WebhookForwarder, webhook_command
from dsec.infra.consumer_loop import ConsumerLoopConfig
from dsec.infra.runtime_registry import RuntimeRegistry
from dsec.schemas import (
    ActuationCommand,
    ActuationResult,
    ActuationStatus,
    DeadLetter,
    RuntimeRegistration,
    Signer,
    WorkerIdentity,
    decode,
    encode,
    now_ms,
)
from dsec.schemas.actuations import (
    GradAccumulationParams,
    MemoryCapParams,
    PrecisionParams,
    SnapshotParams,
)

HERE = WorkerIdentity(job_id="j", worker_id="w0", node_id="n0")
NOW_MS = 1_000_000
SAFETY_S = 60.0


def _command(actuation_id: str | None = None, target: WorkerIdentity = HERE,
             signer: Signer = KEYRING, at_ms: int = NOW_MS, ttl_ms: int = 60_000,
             action=None) -> ActuationCommand:
    return signer.sign(ActuationCommand(
        actuation_id=actuation_id or uuid.uuid4().hex, event_time_ms=at_ms,
        expires_at_ms=at_ms + ttl_ms, target=target, policy_name="p", policy_version=1,
        action=action or SnapshotParams()))


class Results:
    """What a ResultPublisher published, decoded."""

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes, bytes]] = []

    def publish(self, topic: str, key: bytes, value: bytes) -> None:
        self.published.append((topic, key, value))

    def results(self) -> list[ActuationResult]:
        return [decode(v, ActuationResult) for t, _, v in self.published if t == "results"]

    def statuses(self, actuation_id: str) -> list[tuple[str, str]]:
        return [(r.status.value, r.detail) for r in self.results()
                if r.actuation_id == actuation_id]


APPLIED = Outcome(ActuationStatus.APPLIED, "done")


class Recording(Applier):
    def __init__(self, outcome: Outcome | None = APPLIED) -> None:
        self.applied: list[str] = []
        self._outcome = outcome

    def apply(self, command: ActuationCommand) -> Outcome | None:
        self.applied.append(command.actuation_id)
        return self._outcome


def _pipeline(applier: Applier, results: Results, **options) -> CommandPipeline:
    return CommandPipeline(CommandGate(HERE, VERIFIER), applier,
                           ResultPublisher("results", results.publish), clock_ms=lambda: NOW_MS,
                           **options)


def test_a_command_is_gated_applied_once_and_reported_keyed_by_its_node() -> None:
    results, applier = Results(), Recording()
    pipeline = _pipeline(applier, results)
    command = _command()
    assert pipeline.handle(command) is ActuationStatus.APPLIED
    assert pipeline.handle(command) is None  # a duplicate: passed over
    assert applier.applied == [command.actuation_id]
    assert results.statuses(command.actuation_id) == [("applied", "done")]
    assert results.published[0][1] == b"n0"
    assert pipeline.results.results[ActuationStatus.APPLIED] == 1


def test_duplicates_are_reported_where_asked() -> None:
    results = Results()
    pipeline = _pipeline(Recording(), results, report_duplicates=True)
    command = _command()
    pipeline.handle(command)
    assert pipeline.handle(command) is ActuationStatus.REJECTED
    assert results.statuses(command.actuation_id)[1] == ("rejected", DUPLICATE_DETAIL)


def test_a_forgery_with_the_real_id_neither_stops_nor_overwrites_the_real_command() -> None:
    results, applier = Results(), Recording()
    pipeline = _pipeline(applier, results)
    genuine = _command()
    forged = _command(genuine.actuation_id, signer=FORGER, action=PrecisionParams(
        dtype="fp16"))
    assert pipeline.handle(forged) is ActuationStatus.REJECTED  # nothing verified yet
    assert pipeline.handle(genuine) is ActuationStatus.APPLIED
    assert pipeline.handle(forged) is None  # would land on the genuine command's record
    assert applier.applied == [genuine.actuation_id]


def test_commands_for_others_are_passed_over_before_the_gate() -> None:
    results, applier = Results(), Recording()
    pipeline = _pipeline(applier, results)
    other = HERE.model_copy(update={"worker_id": "w1"})
    assert pipeline.handle(_command(target=other)) is None
    assert pipeline.handle(_command(target=other, signer=FORGER)) is None
    assert pipeline.counts.handled == 0 and applier.applied == [] and results.published == []


def test_an_outcome_reported_later_is_not_reported_now() -> None:
    results = Results()
    pipeline = _pipeline(Recording(outcome=None), results)
    assert pipeline.handle(_command()) is None and results.published == []


def test_an_undecodable_command_is_reported_when_it_names_a_target_here() -> None:
    results = Results()
    pipeline = _pipeline(Recording(), results)
    applied = _command()
    pipeline.handle(applied)

    def out_of_bounds(command: ActuationCommand) -> bytes:
        raw = orjson.loads(encode(command))
        raw["action"] = {"kind": "grad_accumulation", "steps": 1000}
        return orjson.dumps(raw)

    mine, theirs = _command(), _command(target=HERE.model_copy(update={"worker_id": "w9"}))
    for value in (out_of_bounds(mine), out_of_bounds(theirs), out_of_bounds(applied), b"{"):
        pipeline.undecodable(value, "steps: too many")
    assert pipeline.counts.undecodable == 4
    assert [r.actuation_id for r in results.results()] == [applied.actuation_id,
                                                          mine.actuation_id]
    assert results.statuses(mine.actuation_id) == [("rejected", "out of bounds: steps: too many")]


def test_the_hook_applier_refuses_an_older_command_and_reports_a_failing_hook() -> None:
    hooks = ApplyHooks()
    hooks.register("grad_accumulation", lambda params: f"steps {params.steps}")
    hooks.register("snapshot", lambda _params: 1 / 0)
    applier = HookApplier(hooks, ResultPublisher("results", Results().publish))
    newer = _command(action=GradAccumulationParams(steps=2), at_ms=NOW_MS)
    older = _command(action=GradAccumulationParams(steps=8), at_ms=NOW_MS - 1_000)
    assert applier.apply(newer) == Outcome(ActuationStatus.APPLIED, "steps 2")
    stale = applier.apply(older)
    assert stale.status is ActuationStatus.STALE and "out of order" in stale.detail
    assert applier.apply(_command()) == Outcome(ActuationStatus.FAILED,
                                                "ZeroDivisionError: division by zero")
    unhooked = applier.apply(_command(action=PrecisionParams(dtype="fp16")))
    assert unhooked.status is ActuationStatus.UNSUPPORTED
    assert "@dsec.on_action('precision')" in unhooked.detail


def test_the_hook_applier_reports_what_the_loop_takes_up_at_a_later_boundary() -> None:
    from dsec.actuators.precision import AutocastController

    hooks, results = ApplyHooks(), Results()
    controller = AutocastController("cpu", "fp32")
    hooks.register("precision", controller.apply)
    applier = HookApplier(hooks, ResultPublisher("results", results.publish))
    with controller():
        pass  # the loop runs under the controller: it can carry a switch out
    command = _command(action=PrecisionParams(dtype="bf16"))
    assert applier.apply(command) is None  # nothing to report before the loop used it
    assert applier.settle() == 0 and results.results() == []
    with controller():
        pass
    assert applier.settle() == 1
    [result] = results.results()
    assert (result.status, result.requested, result.in_force) == (
        ActuationStatus.APPLIED, "bf16", "bf16")
    assert result.actuation_id == command.actuation_id


def test_the_hook_applier_reports_a_watched_cap_that_had_to_be_lifted() -> None:
    from dsec.actuators.memory_cap import MemoryCap

    class Card:  # a test double of torch.cuda's memory calls: no GPU here
        allocated = 2 << 30
        fraction = 1.0

        def is_available(self) -> bool:
            return True

        def current_device(self) -> int:
            return 0

        def total_bytes(self, device: int) -> int:
            return 16 << 30

        def set_fraction(self, fraction: float, device: int) -> None:
            self.fraction = fraction

        def get_fraction(self, device: int) -> float:
            return self.fraction

        def memory_allocated(self, device: int) -> int:
            return self.allocated

        def memory_reserved(self, device: int) -> int:
            return self.allocated

        def empty_cache(self) -> None:
            pass

    card, hooks, results = Card(), ApplyHooks(), Results()
    hooks.register("memory_cap", MemoryCap(cuda=card).apply)
    applier = HookApplier(hooks, ResultPublisher("results", results.publish))
    command = _command(action=MemoryCapParams(limit_bytes=4 << 30))
    assert applier.apply(command).status is ActuationStatus.APPLIED
    assert applier.settle() == 0
    card.allocated = 4 << 30  # live tensors grew to the cap
    assert applier.settle() == 1
    [lifted] = results.results()
    assert (lifted.actuation_id, lifted.status) == (command.actuation_id, ActuationStatus.DEFERRED)
    assert card.fraction == 1.0


def _source(log: InMemoryLog, take, keys=("n0",), letters: list | None = None,
            **config) -> CommandSource:
    dead = letters if letters is not None else []
    return CommandSource(
        ConsumerLoopConfig(("actuations",), "g", **config), {}, keys=lambda: keys, take=take,
        undecodable=lambda value, reason: dead.append((value, reason)),
        dead_letter=lambda message, reason: dead.append((message.offset(), reason)),
        service="test", thread_name="test-commands", consumer_factory=log.consumer)


def _run_until_committed(running, log: InMemoryLog, group: str, offset: int) -> None:
    """Starts ``running`` (a source or what owns one) and stops it once ``offset`` of the
    actuation topic is committed."""
    running.start()
    try:
        wait_for(lambda: log.committed.get((group, "actuations", 0)) == offset, SAFETY_S,
                 0.01, what=f"offset {offset} committed")
    finally:
        running.stop()


def test_the_source_decodes_only_what_is_keyed_to_its_nodes() -> None:
    log = InMemoryLog()
    mine, theirs = _command(), _command(target=HERE.model_copy(update={"node_id": "n1"}))
    for n in range(50):
        log.append("actuations", b"not even json %d" % n, key=b"n1")
    log.append("actuations", encode(theirs), key=b"n1")
    log.append("actuations", encode(mine), key=b"n0")
    taken: list[ActuationCommand] = []
    undecodable: list = []
    source = _source(log, taken.append, letters=undecodable)
    _run_until_committed(source, log, "g", 52)
    assert taken == [mine] and undecodable == [] and source.passed_over == 51


def test_a_command_whose_handling_raised_is_dead_lettered_and_no_other_is_taken_again() -> None:
    log = InMemoryLog()
    commands = [_command() for _ in range(4)]
    for command in commands:
        log.append("actuations", encode(command), key=b"n0")
    taken: list[str] = []
    letters: list = []

    def take(command: ActuationCommand) -> None:
        taken.append(command.actuation_id)
        if command == commands[1]:
            raise RuntimeError("the applier broke")

    source = _source(log, take, letters=letters)
    _run_until_committed(source, log, "g", 4)
    assert taken == [c.actuation_id for c in commands]
    assert len(letters) == 1 and letters[0][0] == 1 and "the applier broke" in letters[0][1]
    assert source.loop.stats.dead_lettered == 1


def test_dead_letters_are_published_with_their_reason() -> None:
    results = Results()
    dead_letters_to("dead", results.publish, "test")(
        InMemoryMessage("actuations", 0, 7, b"payload"), "RuntimeError: broke")
    [(topic, key, value)] = results.published
    letter = decode(value, DeadLetter)
    assert (topic, key) == ("dead", b"actuations")
    assert (letter.offset, letter.reason, letter.payload) == (7, "RuntimeError: broke",
                                                             "payload")


def test_the_in_process_actuator_reads_from_start_and_applies_at_the_step_boundary() -> None:
    log = InMemoryLog()
    old = _command(at_ms=0, ttl_ms=3_600_000)
    log.append("actuations", encode(old), key=b"n0")
    hooks = ApplyHooks()
    applied: list[str] = []
    hooks.register("precision", lambda params: applied.append(params.dtype) or "ok")
    results = Results()
    woken: list[int] = []
    actuator = InProcessActuator(
        HERE, {"group.id": "worker"}, "actuations", "results", hooks, VERIFIER, results.publish,
        on_command=lambda: woken.append(1), consumer_factory=log.consumer)
    actuator.start(ready_timeout_s=SAFETY_S)
    try:
        command = _command(at_ms=now_ms(), action=PrecisionParams(dtype="fp16"))
        log.append("actuations", encode(command), key=b"n0")
        wait_for(lambda: woken, SAFETY_S, 0.01, what="the command queued")
        assert applied == []  # not before the step boundary
        assert actuator.apply_pending() == 1
    finally:
        actuator.stop()
    assert applied == ["fp16"] and results.statuses(command.actuation_id) == [("applied", "ok")]
    assert results.statuses(old.actuation_id) == [] and log.commits == []


def test_the_webhook_forwarder_outlasts_a_flood_of_forgeries_without_committing_each() -> None:
    """Issue 24 without a broker: forgeries keyed to other nodes are passed over undecoded,
    those keyed to the runtime's node are decoded and refused, and the genuine command is
    posted once, with a commit per batch rather than per message."""
    registry = RuntimeRegistry()
    registry.put(RuntimeRegistration(
        runtime_id="agent-1", runtime_type="dify", concurrency=1, mean_call_latency_ms=1.0,
        function_calling=True, webhook_url="http://127.0.0.1:9/hook", node_id="agent-host"))
    runtime = WorkerIdentity(job_id="j", worker_id="agent-1", node_id="agent-host")
    genuine = _command(target=runtime, at_ms=now_ms(), ttl_ms=10_000)
    log = InMemoryLog()
    for n in range(3000):
        if n % 2:
            forged = _command(genuine.actuation_id if n % 3 == 0 else None, target=runtime,
                              signer=FORGER, at_ms=now_ms())
            log.append("actuations", encode(forged), key=b"agent-host", partitions=1)
        else:
            log.append("actuations", b"{}", key=b"node-%d" % (n % 7), partitions=1)
    log.append("actuations", encode(genuine), key=b"agent-host")
    posted: list[bytes] = []
    results = Results()
    forwarder = WebhookForwarder(
        registry, "j", {"group.id": "webhooks"}, "actuations", "results", VERIFIER,
        results.publish, 5.0, lambda _url, body, _t: posted.append(body) or (200, b""),
        consumer_factory=log.consumer)
    _run_until_committed(forwarder, log, "webhooks", 3001)
    assert [webhook_command(body).actuation_id for body in posted] == [
        genuine.actuation_id]
    assert ("applied", "delivered to webhook") in results.statuses(genuine.actuation_id)
    assert len(log.commits) <= 3001 // 500 + 1
    assert forwarder.handle(encode(genuine)) is None  # a replay: not posted again
    assert len(posted) == 1
