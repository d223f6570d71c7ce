"""Leader election through Kafka (NELI, as goharvest/goNELI).

Every candidate joins consumer group ``leaderGroupID`` on ``leaderTopic``; whoever Kafka assigns
partition 0 is the leader. The leader also publishes heartbeats to partition 0 and consumes
them: when it has not seen its own heartbeat within ``heartbeatTimeout`` (network partition,
broker gone) it fences itself — stops marking — on the worst-case assumption that the group
coordinator will hand partition 0 to someone else. Seeing its heartbeat again while still the
assignee restores leadership (with a new epoch, hence a new leader id). Those rules are
:class:`~sluiceway.election.campaign.NeliCampaign`'s; this module is the Kafka driver.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

from sluiceway.clock import Clock, SystemClock
from sluiceway.election.campaign import NeliCampaign
from sluiceway.election.protocol import ElectionListener

log = logging.getLogger("sluiceway.election")


class KafkaElection:
    """NELI over confluent-kafka. Implements ``LeaderElection``; the rules are :class:`NeliCampaign`'s."""

    def __init__(
        self,
        kafka_config: dict[str, Any],
        topic: str,
        group_id: str,
        *,
        heartbeat_timeout: float = 5.0,
        min_poll_interval: float = 0.1,
        poll_duration: float = 0.001,
        clock: Clock | None = None,
    ) -> None:
        self.kafka_config = dict(kafka_config)
        self.topic = topic
        self.group_id = group_id
        self.heartbeat_timeout = heartbeat_timeout
        self.heartbeat_interval = max(min_poll_interval, heartbeat_timeout / 10)
        self.poll_timeout = max(poll_duration, min(min_poll_interval, 0.1))
        self.member = uuid.uuid4().hex
        self.clock: Clock = clock or SystemClock()
        self._campaign: NeliCampaign | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def epoch(self) -> int:
        """The epoch of the current (or last) term; 0 before the first."""
        return 0 if self._campaign is None else self._campaign.epoch

    def start(self, listener: ElectionListener) -> None:
        self._campaign = NeliCampaign(
            listener,
            topic=self.topic,
            group_id=self.group_id,
            member=self.member,
            heartbeat_timeout=self.heartbeat_timeout,
            heartbeat_interval=self.heartbeat_interval,
            clock=self.clock,
        )
        self._ensure_topic()
        self._thread = threading.Thread(
            target=self._run, args=(self._campaign,), name="sluice-neli", daemon=True
        )
        self._thread.start()

    def is_leader(self) -> bool:
        return self._campaign is not None and self._campaign.is_leader()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # -- internals ---------------------------------------------------------------------------
    def _ensure_topic(self) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        admin = AdminClient({k: v for k, v in self.kafka_config.items() if not k.startswith("group.")})
        try:
            if self.topic in admin.list_topics(timeout=10).topics:
                return
            futures = admin.create_topics([NewTopic(self.topic, num_partitions=1, replication_factor=1)])
            futures[self.topic].result(timeout=15)
        except Exception as exc:
            if not topic_already_exists(exc):  # a rival created it first: fine
                log.warning("could not create leader topic %s: %s", self.topic, exc)

    def _run(self, campaign: NeliCampaign) -> None:
        from confluent_kafka import Consumer, KafkaError, Producer

        # The broker (or librdkafka) does not know the leader topic: deleted, or the broker lost its state.
        unknown_topic = {
            KafkaError.UNKNOWN_TOPIC_OR_PART,
            KafkaError.UNKNOWN_TOPIC_ID,
            KafkaError._UNKNOWN_TOPIC,
        }

        consumer_conf = {
            **self.kafka_config,
            "group.id": self.group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "latest",
            # Fast failover: the coordinator notices a dead leader within the session timeout.
            "session.timeout.ms": self.kafka_config.get(
                "session.timeout.ms", max(6000, int(self.heartbeat_timeout * 1200))
            ),
            "heartbeat.interval.ms": self.kafka_config.get("heartbeat.interval.ms", 1000),
        }
        consumer = Consumer(consumer_conf)
        producer = Producer(
            {**self.kafka_config, "linger.ms": 0, "message.timeout.ms": int(self.heartbeat_timeout * 1000)}
        )

        def on_assign(_consumer: Any, partitions: list[Any]) -> None:
            campaign.on_assign((p.topic, p.partition) for p in partitions)

        def on_revoke(_consumer: Any, partitions: list[Any]) -> None:
            campaign.on_revoke((p.topic, p.partition) for p in partitions)

        consumer.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
        next_topic_check = 0.0
        try:
            while not self._stop.is_set():
                msg = consumer.poll(self.poll_timeout)
                now = self.clock.monotonic()
                error = msg.error() if msg is not None else None
                if error is not None and now >= next_topic_check:
                    # A broker that lost its state (or a deleted topic): put the leader topic back.
                    log.debug("NELI consumer: %s", error)
                    if error.code() in unknown_topic:
                        self._ensure_topic()
                    next_topic_check = now + 1.0
                if msg is not None and error is None:
                    campaign.on_message(msg.partition(), msg.value(), now)
                if campaign.beat_due(now):
                    try:
                        producer.produce(self.topic, value=campaign.beat, partition=0)
                    except Exception as exc:  # BufferError when the broker is away: keep trying
                        log.debug("heartbeat not queued: %s", exc)
                producer.poll(0)
                campaign.check_deadline(now)
        except BaseException as exc:
            self._error = exc
            log.exception("NELI election thread failed")
        finally:
            was_leading = campaign.leave()
            try:
                consumer.close()  # leaves the group: a rival is assigned partition 0 promptly
            except Exception:
                log.debug("consumer close failed", exc_info=True)
            producer.flush(1)
            if was_leading:
                campaign.listener.leader_revoked()


def topic_already_exists(exc: BaseException) -> bool:
    """Whether a topic creation failed because the topic exists (by Kafka's error code)."""
    from confluent_kafka import KafkaError, KafkaException

    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS
