"""A Faust app whose producer is idempotent with ``acks=all``, whatever the processing guarantee,
and whose consumer does not lose what it fetched during a table recovery.

The one module that touches Faust, mode and aiokafka internals: the stream jobs take the
Faust types they use from here, and ``check_faust_internals`` (run by ``make_faust_app``)
fails at start-up, naming the installed version, when an internal relied on is gone."""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import faust
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import IllegalStateError
from aiokafka.partitioner import murmur2
from faust import App, Table
from faust.transport import consumer as faust_consumer
from faust.transport.drivers import aiokafka as aiokafka_driver
from faust.types import TP, EventT, StreamT, TopicT
from mode.utils.objects import cached_property
from mode.utils.queues import FlowControlEvent

from dsec.infra.batch_guard import BatchGuard, DeliveryError
from dsec.infra.commit_stalls import CommitStalls
from dsec.infra.observability.metrics import CONSUMER_LAG, ProcessMetrics
from dsec.infra.records import Output, Record
from dsec.schemas.settings import DsecSettings

__all__ = [
    "TP", "App", "CommitStalls", "DsecFaustApp", "EventT", "FaustInternalsChanged",
    "QuietWorker", "StreamT", "Table", "TopicT", "batch_guard", "check_faust_internals",
    "committed_offsets", "fetch_topic_metadata", "make_faust_app", "on_partitions_assigned",
    "publish", "record_of", "seek_to_committed_or_reset", "topic_partitioner",
    "watch_faust_app",
]


class FaustInternalsChanged(RuntimeError):
    """An internal of Faust, mode or aiokafka that dsec overrides or reads is gone from the
    installed version: ``distribution`` ``version`` lacks ``owner``.``attribute``."""

    def __init__(self, distribution: str, version: str, owner: str, attribute: str) -> None:
        super().__init__(
            f"{distribution} {version} has no {owner}.{attribute}, which dsec's Faust app "
            f"overrides or reads; install the version pinned in dsec's pyproject.toml")
        self.distribution = distribution
        self.version = version
        self.owner = owner
        self.attribute = attribute


# (distribution, class, attributes): what this module overrides, calls or reads. Attributes
# only a log line reads for diagnostics are not here: their absence is logged, not fatal.
_INTERNALS: tuple[tuple[str, type, tuple[str, ...]], ...] = (
    ("faust-streaming", aiokafka_driver.Producer, ("_settings_extra", "_ensure_producer")),
    ("faust-streaming", aiokafka_driver.AIOKafkaConsumerThread,
     ("getmany", "seek_to_committed", "_ensure_consumer", "call_thread")),
    ("faust-streaming", aiokafka_driver.Consumer, ("_new_consumer_thread", "_thread")),
    ("faust-streaming", aiokafka_driver.Transport, ("Consumer", "Producer")),
    ("faust-streaming", faust_consumer.Consumer,
     ("_committed_offset", "_paused_partitions", "highwater", "assignment")),
    ("faust-streaming", faust.App, ("flow_control", "_new_transport", "_new_producer_transport")),
    ("faust-streaming", faust.Worker, ("on_setup_root_logger",)),
    ("mode-streaming", FlowControlEvent, ("resume", "is_active")),
    ("aiokafka", AIOKafkaConsumer,
     ("committed", "seek_to_committed", "seek_to_end", "seek_to_beginning")),
    ("aiokafka", AIOKafkaProducer, ("partitions_for",)),
)


def _declares(owner: type, attribute: str) -> bool:
    """On the class, or annotated on it or a base (attributes set per instance)."""
    return hasattr(owner, attribute) or any(
        attribute in vars(klass).get("__annotations__", {}) for klass in owner.__mro__)


def check_faust_internals() -> None:
    """Raises ``FaustInternalsChanged`` for the first internal relied on that the installed
    Faust, mode or aiokafka no longer has."""
    for distribution, owner, attributes in _INTERNALS:
        for attribute in attributes:
            if not _declares(owner, attribute):
                raise FaustInternalsChanged(
                    distribution, importlib.metadata.version(distribution),
                    f"{owner.__module__}.{owner.__qualname__}", attribute)


class _IdempotentProducer(aiokafka_driver.Producer):
    def _settings_extra(self) -> dict[str, Any]:
        return {"acks": "all", "enable_idempotence": True}


class _ConsumerThread(aiokafka_driver.AIOKafkaConsumerThread):
    """Two guards against messages the Kafka client handed over that Faust then dropped,
    the client's position already past them: lost to this worker for good when the group
    had committed nothing for their partition (a worker killed before its first commit).

    - A fetch gets its own copy of the active partitions. Faust passes its live set, and
      table recovery empties it while the fetch waits (it pauses the changelogs it has
      read, the source partitions still paused): aiokafka takes an empty set for "every
      partition" and hands over the paused source partitions' messages, which Faust drops.
    - The seek to the committed offsets after a rebalance puts a partition with no
      committed offset where the reset policy says (aiokafka leaves it where it is), so
      what was fetched and dropped before it is fetched again.
    """

    async def getmany(self, active_partitions: set | None, timeout: float) -> Any:
        own = None if active_partitions is None else set(active_partitions)
        return await super().getmany(own, timeout)

    async def seek_to_committed(self) -> Mapping[Any, int]:
        return await self.call_thread(seek_to_committed_or_reset, self._ensure_consumer(),
                                      self.app.conf.consumer_auto_offset_reset)


async def seek_to_committed_or_reset(consumer: Any, auto_offset_reset: str) -> Mapping[Any, int]:
    """Seeks an aiokafka consumer's assigned partitions to their committed offsets, and
    those with none to where ``auto_offset_reset`` puts them; returns the committed ones."""
    committed = await consumer.seek_to_committed()
    never = [tp for tp, offset in committed.items() if not offset]
    if never:
        try:
            if auto_offset_reset == "latest":
                await consumer.seek_to_end(*never)
            else:
                await consumer.seek_to_beginning(*never)
        except IllegalStateError:  # a rebalance took them away; the next one seeks
            pass
    return committed


class _Consumer(aiokafka_driver.Consumer):
    def _new_consumer_thread(self) -> _ConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class _Transport(aiokafka_driver.Transport):
    Consumer = _Consumer
    Producer = _IdempotentProducer


class ResumeKeepsBuffers(FlowControlEvent):
    """Faust's flow control, except that resuming flow that is already on keeps the stream
    buffers.

    Faust empties every stream buffer whenever flow is resumed, and after a rebalance the
    table recovery resumes it twice: once when recovery starts reading, and again after the
    final seek to the committed offsets. Messages fetched in between sit in the buffers; the
    second resume dropped them without an acknowledgement, while the consumer's read
    offsets had already moved past them, so they were never fetched again and that
    partition's commits stopped at the first of them for good. Buffers are emptied only
    when flow comes back from a suspension (a revocation), when what they hold belongs to
    the assignment before."""

    def resume(self) -> None:
        if self.is_active():
            return
        super().resume()


class DsecFaustApp(faust.App):
    @cached_property
    def flow_control(self) -> FlowControlEvent:
        return ResumeKeepsBuffers(loop=self.loop)

    def _new_transport(self) -> _Transport:
        return _Transport(self.conf.broker_consumer, self)

    def _new_producer_transport(self) -> _Transport:
        return _Transport(self.conf.broker_producer, self)


class QuietWorker(faust.Worker):
    """A Faust worker whose root logger stays at the chosen level: Faust leaves it at DEBUG,
    and every message sent then builds a debug record before it is filtered out."""

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        logger.setLevel(level)


def _credentials(settings: DsecSettings) -> faust.types.auth.CredentialsT | None:
    protocol = settings.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return None
    ssl_context = None
    if protocol in ("SSL", "SASL_SSL"):
        ssl_context = faust.SSLCredentials(
            cafile=settings.kafka_ssl_ca_location,
        ).context
        if settings.kafka_ssl_certificate_location:
            ssl_context.load_cert_chain(
                settings.kafka_ssl_certificate_location, settings.kafka_ssl_key_location
            )
    if protocol == "SSL":
        return faust.SSLCredentials(context=ssl_context)
    password = settings.kafka_sasl_password
    return faust.SASLCredentials(
        username=settings.kafka_sasl_username,
        password=password.get_secret_value() if password else None,
        mechanism=settings.kafka_sasl_mechanism or "PLAIN",
        ssl_context=ssl_context,
    )


def make_faust_app(app_id: str, settings: DsecSettings, partitions: int) -> DsecFaustApp:
    check_faust_internals()
    return DsecFaustApp(
        app_id,
        datadir=str(settings.data_dir.resolve() / "faust"),
        broker=f"kafka://{settings.bootstrap}",
        broker_credentials=_credentials(settings),
        store="memory://",
        topic_partitions=partitions,
        topic_replication_factor=settings.replication_factor,  # the tables' changelogs
        value_serializer="raw",
        key_serializer="raw",
        web_enabled=False,
        producer_acks=-1,
        broker_commit_interval=1.0,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=settings.stream_session_timeout_s,
        table_cleanup_interval=30.0,
        # Probe messages carry ~1000 samples (~60 kB): fetch many per partition per round.
        consumer_max_fetch_size=16 * 1024 * 1024,
        stream_buffer_maxsize=8192,
        # Features and changelog entries go out in batches, not one request each.
        producer_linger=0.005,
        producer_max_batch_size=1 << 20,
        producer_max_request_size=8 << 20,
        producer_compression_type="lz4",
    )


async def publish(app: App, topic: str, key: bytes, value: bytes) -> asyncio.Future:
    """Hands a message to the app's producer; the future resolves once the broker has it.

    Straight to the producer rather than through ``Topic.send``: Faust's producer lookup
    there yields to the event loop three times per message, and each turn lets the producer
    send a request for the one or two messages queued so far. A producer that refuses the
    message (a topic not authorized, a buffer it cannot grow) raises ``DeliveryError``."""
    try:
        return await app.producer.send(topic, key, value, partition=None, timestamp=None,
                                       headers=None)
    except Exception as exc:
        raise DeliveryError(f"{topic}: {exc!r}") from exc


def batch_guard(app: App, job: str, dead_letters_topic: str,
                on_dead_lettered: Callable[[int], None] = lambda count: None) -> BatchGuard:
    """The guard of ``job``'s batches, sending through ``app``'s producer."""
    async def send(output: Output) -> asyncio.Future:
        return await publish(app, output.topic, output.key, output.value())

    return BatchGuard(job, send, dead_letters_topic, on_dead_lettered)


def on_partitions_assigned(app: App, callback: Callable[[], None]) -> None:
    """Calls ``callback`` each time a rebalance hands this process its partitions: tables
    may then hold what another process wrote for them, so what was cached from the tables
    must be read again."""
    async def assigned(_sender: Any, _assigned: Any, **_signal: Any) -> None:
        callback()

    app.on_partitions_assigned.connect(assigned)


async def fetch_topic_metadata(app: App, topic: str) -> None:
    """Has the app's producer fetch ``topic``'s metadata. A table with ``use_partitioner``
    chooses each changelog partition with the producer's partitioner, synchronously, which
    needs that metadata: fetch it before the table's first write."""
    producer = app.producer._ensure_producer()  # type: ignore[attr-defined]
    await producer.partitions_for(topic)


async def topic_partitioner(app: App, topic: str) -> Callable[[bytes], int]:
    """The partition the app's producer gives a key on ``topic``: Kafka's default
    partitioner (murmur2 of the key), over the partitions the broker has for it."""
    producer = app.producer._ensure_producer()  # type: ignore[attr-defined]
    partitions = len(await producer.partitions_for(topic))

    def partition_of(key: bytes) -> int:
        return (murmur2(key) & 0x7FFFFFFF) % partitions

    return partition_of


async def committed_offsets(consumer: Any, tps: Iterable[TP],
                            timeout_s: float = 2.0) -> dict[TP, int | None]:
    """The group's committed offset of each partition (None: nothing committed), from the
    Kafka client's ``committed`` on the consumer's thread; where the client does not answer
    within ``timeout_s``, what the Faust consumer last committed itself."""
    tps = list(tps)
    try:
        thread = consumer._thread
        client = thread._ensure_consumer()
        offsets = await thread.call_thread(_committed_within, client, tps, timeout_s)
    except Exception:  # no client yet, a rebalance, a slow coordinator
        bookkeeping = consumer._committed_offset
        return {tp: bookkeeping.get(tp) for tp in tps}
    return dict(zip(tps, offsets, strict=True))


async def _committed_within(client: Any, tps: list[TP], timeout_s: float) -> list[int | None]:
    return await asyncio.wait_for(asyncio.gather(
        *(client.committed(TopicPartition(tp.topic, tp.partition)) for tp in tps)), timeout_s)


def watch_faust_app(
    app: App,
    metrics: ProcessMetrics,
    services_by_topic: Mapping[str, str],
    lag_interval_s: float = 5.0,
    silent_after_s: float = 30.0,
    stuck_after_s: float = 180.0,
) -> None:
    """The worker's health (started, not crashed, its event loop turning, and no source
    partition whose commits stood still for ``stuck_after_s`` with messages behind them:
    a wedged consumer, for a liveness probe to restart) as checks of ``metrics``, and the
    consumer lag of the source topics named in ``services_by_topic`` (topic -> the service
    that reads it), refreshed every ``lag_interval_s``."""
    lag = metrics.gauge(CONSUMER_LAG)
    ticks: dict[str, float] = {}
    reported: set[tuple[str, str, str]] = set()
    stalls = CommitStalls(log_every_s=silent_after_s)

    async def refresh_lag() -> None:
        consumer = app.consumer
        watched = [tp for tp in consumer.assignment() if tp.topic in services_by_topic]
        committed = await committed_offsets(consumer, watched)
        current: dict[tuple[str, str, str], int] = {}
        observed: set[tuple[str, int]] = set()
        for tp in watched:
            service = services_by_topic[tp.topic]
            end = consumer.highwater(tp)
            if end is None:
                continue
            done = committed.get(tp)
            current[(service, tp.topic, str(tp.partition))] = max(end - (done or 0), 0)
            _watch_commit(consumer, tp, done, end, stalls)
            observed.add((tp.topic, tp.partition))
        stalls.keep_only(observed)
        for labels in reported - current.keys():
            lag.remove(*labels)  # a partition this worker no longer holds
        for labels, value in current.items():
            lag.labels(*labels).set(value)
        reported.clear()
        reported.update(current)

    @app.timer(interval=1.0, name=f"{app.conf.id}-metrics-tick")
    async def metrics_tick() -> None:
        now = time.monotonic()
        ticks["last"] = now
        if now - ticks.get("lag", 0.0) >= lag_interval_s:
            ticks["lag"] = now
            try:
                await refresh_lag()
            except Exception:  # telemetry must not stop the worker
                logging.getLogger(__name__).exception("consumer lag not measured")

    def healthy() -> str | None:
        if app.crashed:
            return f"the Faust worker crashed: {app.crash_reason!r}"
        last = ticks.get("last")
        if last is None:
            return "the Faust worker has not started yet"
        silent_s = time.monotonic() - last
        if silent_s > silent_after_s:
            return f"the Faust event loop has been silent for {silent_s:.0f} s"
        return None

    metrics.add_health_check("faust-worker", healthy)

    def commits_moving() -> str | None:
        stuck = stalls.longest(time.monotonic())
        if stuck is None or stuck[1] < stuck_after_s:
            return None
        (topic, partition), stood_s = stuck
        return (f"commits on {topic}:{partition} have stood still for {stood_s:.0f} s with "
                f"messages behind them (not paused for table recovery)")

    metrics.add_health_check("faust-commits", commits_moving)


def _watch_commit(consumer: Any, tp: Any, committed: int | None, end: int,
                  stalls: CommitStalls) -> None:
    """Logs a partition whose committed offset has stood still for a while (every
    ``stalls.log_every_s``) with the consumer's bookkeeping for it."""
    paused = tp in getattr(consumer, "_paused_partitions", ())  # recovering its tables
    stood_s = stalls.observe((tp.topic, tp.partition), committed, end, paused,
                             time.monotonic())
    if stood_s is None:
        return
    acked = sorted(getattr(consumer, "_acked", {}).get(tp) or [])
    in_flight = sorted(m.offset for m in list(getattr(consumer, "_unacked_messages", ()))
                       if m.tp == tp)
    gap = getattr(consumer, "_gap", {}).get(tp)
    logging.getLogger(__name__).warning(
        "commits on %s:%s stalled at %s for %.0f s with the end at %s: read offset %s, "
        "%d acked (%s..%s), %d in flight (%s..%s), gap %s; %s",
        tp.topic, tp.partition, committed, stood_s, end,
        getattr(consumer, "_read_offset", {}).get(tp), len(acked),
        acked[0] if acked else None, acked[-1] if acked else None, len(in_flight),
        in_flight[0] if in_flight else None, in_flight[-1] if in_flight else None,
        sorted(gap) if gap else None, _flow_state(consumer, tp))


def _flow_state(consumer: Any, tp: Any) -> str:
    """Where the worker's flow of messages may be held back: the consumer's flow, the
    stream buffers' flow control, a rebalance or table recovery not finished, the fetcher,
    the partition's state in the Kafka client. For the log of a stalled partition."""
    app = consumer.app
    recovery = getattr(app.tables, "recovery", None)
    fetcher = getattr(app, "_fetcher", None)
    state = {
        "consumer_flow": getattr(consumer, "flow_active", None),
        "flow_control": app.flow_control.is_active(),
        "rebalancing": app.rebalancing,
        "recovery_completed": recovery.completed.is_set() if recovery is not None else None,
        "fetcher": getattr(fetcher, "state", None),
        "active": tp in (getattr(consumer, "_active_partitions", None) or ()),
    }
    try:
        client = consumer._thread._ensure_consumer()
        tp_state = client._fetcher._subscriptions.subscription.assignment.state_value(
            TopicPartition(tp.topic, tp.partition))
        state["client"] = (None if tp_state is None else
                           f"position={tp_state._position} status={tp_state._status} "
                           f"paused={tp_state.paused} "
                           f"highwater={tp_state.highwater} fetch_ms={tp_state.timestamp}")
    except Exception as exc:  # the client's internals differ: say so and carry on
        state["client"] = f"unknown ({type(exc).__name__})"
    return " ".join(f"{key}={value}" for key, value in state.items())


def record_of(event: EventT) -> Record:
    """A stream event as the stream stages take it: the message and where it came from."""
    message = event.message
    return Record(topic=message.topic, partition=message.partition, offset=message.offset,
                  key=message.key, value=message.value)
