"""Commands for workers in endpoint mode: the gateway's mailbox, its poll and results routes
on the real HTTP server, and the worker's poll through the gateway client."""

from __future__ import annotations

import threading
import time

from gateway_server import RecordingPublisher, serve

from dsec.actuators.polled_source import PollConfig, PolledCommandSource
from dsec.actuators.webhooks import WebhookPoster
from dsec.infra.command_mailbox import CommandMailbox, MailboxConfig
from dsec.infra.runtime_registry import RuntimeRegistry
from dsec.ingest.gateway import IngestGateway
from dsec.ingest.gateway_client import CommandPoller, GatewayClient, Outcome
from dsec.ingest.gateway_config import GatewayConfig
from dsec.schemas import (
    ActuationCommand,
    ActuationResult,
    ActuationStatus,
    RuntimeRegistration,
    WorkerIdentity,
    decode,
    encode,
    new_event_id,
    now_ms,
)
from dsec.schemas.actuations import SamplerParams
from dsec.schemas.signing import HmacSigner, HmacVerifier

TOKEN = "enrolment-token"
SIGNER = HmacSigner(b"key")


def _registration(runtime_id: str, delivery: str = "poll") -> RuntimeRegistration:
    return RuntimeRegistration(runtime_id=runtime_id, runtime_type="dsec-probe", concurrency=1,
                               mean_call_latency_ms=0, function_calling=False,
                               node_id="node-p", delivery=delivery)


def _command(worker_id: str, expires_in_ms: int = 60_000) -> ActuationCommand:
    return SIGNER.sign(ActuationCommand(
        actuation_id=new_event_id(), expires_at_ms=now_ms() + expires_in_ms,
        target=WorkerIdentity(job_id="job-a", worker_id=worker_id, node_id="node-p"),
        policy_name="test", policy_version=1, action=SamplerParams(paused=True)))


def test_the_mailbox_hands_out_live_commands_once_and_reports_the_expired() -> None:
    expired: list[str] = []
    mailbox = CommandMailbox(MailboxConfig(max_commands_per_runtime=2),
                             on_expired=lambda command: expired.append(command.actuation_id),
                             clock_ms=lambda: now_ms() + 30_000)  # taken 30 s from now
    first, late = _command("w-1"), _command("w-1", expires_in_ms=1_000)
    assert mailbox.put(first) and mailbox.put(late)
    assert not mailbox.put(_command("w-1"))  # full: the runtime has not fetched
    assert mailbox.take("w-1") == [first] and expired == [late.actuation_id]
    assert mailbox.take("w-1") == []  # handed out once
    assert mailbox.delivered("w-1", first.actuation_id) == first
    assert mailbox.delivered("w-2", first.actuation_id) is None  # not handed to w-2


def test_the_forwarder_queues_a_polling_runtimes_command_and_reports_nothing_yet() -> None:
    registry = RuntimeRegistry()
    registry.enrol(_registration("w-poll"))
    mailbox = CommandMailbox(MailboxConfig(max_commands_per_runtime=1))
    poster = WebhookPoster(registry, post=lambda *_: (500, b""), timeout_s=1, mailbox=mailbox)
    command = _command("w-poll")
    assert poster.apply(command) is None  # the runtime reports once it is in force
    assert mailbox.take("w-poll") == [command]
    mailbox.put(command)
    full = poster.apply(_command("w-poll"))
    assert full is not None and full.status is ActuationStatus.FAILED
    assert "not fetched" in full.detail
    unheld = WebhookPoster(registry, post=lambda *_: (500, b""), timeout_s=1).apply(command)
    assert unheld is not None and unheld.status is ActuationStatus.REJECTED


def _gateway(mailbox: CommandMailbox, results: RecordingPublisher) -> IngestGateway:
    return IngestGateway(GatewayConfig(token=TOKEN, max_poll_wait_s=5), RuntimeRegistry(),
                         RecordingPublisher(), "job-a", mailbox=mailbox, results=results)


def test_a_worker_fetches_its_signed_commands_and_posts_their_results() -> None:
    mailbox, results = CommandMailbox(), RecordingPublisher()
    config = GatewayConfig(token=TOKEN, max_poll_wait_s=5)
    with serve(_gateway(mailbox, results), config) as gateway:
        client = GatewayClient(gateway.url, TOKEN, _registration("w-poll"), timeout_s=5)
        poller = client.sibling(timeout_s=5)  # shares the registration and its token
        answer, none = poller.fetch_commands(0)
        assert answer.outcome is Outcome.SENT and none == [] and client.registered

        command = _command("w-poll")
        threading.Timer(0.5, mailbox.put, (command,)).start()
        started_s = time.monotonic()
        answer, fetched = poller.fetch_commands(4)  # held open until the command is there
        waited_s = time.monotonic() - started_s
        assert answer.outcome is Outcome.SENT and 0.4 < waited_s < 2.0
        [value] = fetched
        received = decode(value, ActuationCommand)
        HmacVerifier(b"key").verify(received)  # signed as on the topic
        assert received == command

        result = ActuationResult(
            actuation_id=command.actuation_id, action_kind="snapshot",  # the command's is published
            identity=WorkerIdentity(job_id="other", worker_id="someone-else", node_id="x"),
            status=ActuationStatus.APPLIED, detail="paused", requested="true", in_force="true")
        assert client.post_result(encode(result)).outcome is Outcome.SENT
        unknown = result.model_copy(update={"actuation_id": new_event_id()})
        refused = client.post_result(encode(unknown))
        assert refused.outcome is Outcome.REFUSED and "unknown_actuation" in refused.detail
        assert client.registered  # a refused result does not register again
        client.close()
        poller.close()

    [(key, value)] = results.published
    published = decode(value, ActuationResult)
    assert key == b"node-p" and published.status is ActuationStatus.APPLIED
    assert published.identity == WorkerIdentity(job_id="job-a", worker_id="w-poll",
                                                node_id="node-p")  # as registered
    assert published.action_kind == "sampler" and published.in_force == "true"


def test_polling_is_for_runtimes_registered_to_poll_within_the_wait_allowed() -> None:
    config = GatewayConfig(token=TOKEN, max_poll_wait_s=5)
    with serve(_gateway(CommandMailbox(), RecordingPublisher()), config) as gateway:
        webhook = GatewayClient(gateway.url, TOKEN, _registration("w-hook", "webhook"), 5)
        answer, _ = webhook.fetch_commands(0)
        assert answer.outcome is Outcome.REFUSED and "not_polling" in answer.detail
        poller = GatewayClient(gateway.url, TOKEN, _registration("w-poll"), 5)
        answer, _ = poller.fetch_commands(60)
        assert answer.outcome is Outcome.REFUSED and "wait_s" in answer.detail
        for client in (webhook, poller):
            client.close()


def test_the_polled_source_takes_what_comes_backs_off_and_stops_at_once() -> None:
    command = _command("w-poll")
    answers: list[list[bytes] | None] = [None, [encode(command), b"not a command"]]
    asked: list[float] = []
    stopped = threading.Event()

    class Poll:
        def fetch(self, wait_s: float) -> list[bytes] | None:
            asked.append(wait_s)
            if answers:
                return answers.pop(0)
            stopped.wait(30)  # a long poll, until interrupted
            return []

        def interrupt(self) -> None:
            stopped.set()

    taken: list[ActuationCommand] = []
    undecodable: list[str] = []
    source = PolledCommandSource(Poll(), taken.append,
                                 lambda _value, reason: undecodable.append(reason),
                                 PollConfig(wait_s=7, backoff_min_s=0.01))
    source.start()
    assert source.wait_ready(5)
    deadline_s = time.monotonic() + 5
    while len(asked) < 3 and time.monotonic() < deadline_s:
        time.sleep(0.01)
    assert taken == [command] and len(undecodable) == 1
    assert asked[:3] == [0.0, 7, 7]  # the first at once, then long polls
    started_s = time.monotonic()
    source.stop(timeout_s=5)
    assert time.monotonic() - started_s < 1.0


def test_the_poller_logs_a_lasting_failure_once(caplog) -> None:
    client = GatewayClient("http://127.0.0.1:9", TOKEN, _registration("w-away"), 1)
    poller = CommandPoller(client)
    assert poller.fetch(0) is None and poller.fetch(0) is None
    assert len([r for r in caplog.records if "commands not fetched" in r.message]) == 1
