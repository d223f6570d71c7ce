"""Leader election through Kafka (NELI, as goharvest/goNELI).

Every candidate joins consumer group ``leaderGroupID`` on ``leaderTopic``; whoever Kafka assigns
partition 0 is the leader. The leader also publishes heartbeats to partition 0 and consumes
them: when it has not seen its own heartbeat within ``heartbeatTimeout`` (network partition,
broker gone) it fences itself — stops marking — on the worst-case assumption that the group
coordinator will hand partition 0 to someone else. Seeing its heartbeat again while still the
assignee restores leadership (with a new epoch, hence a new leader id).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

from sluiceway.harvest.ports import ElectionListener

log = logging.getLogger("sluiceway.election")


class KafkaElection:
    """NELI over confluent-kafka. Implements ``LeaderElection``."""

    def __init__(
        self,
        kafka_config: dict[str, Any],
        topic: str,
        group_id: str,
        *,
        heartbeat_timeout: float = 5.0,
        min_poll_interval: float = 0.1,
        poll_duration: float = 0.001,
    ) -> None:
        self.kafka_config = dict(kafka_config)
        self.topic = topic
        self.group_id = group_id
        self.heartbeat_timeout = heartbeat_timeout
        self.heartbeat_interval = max(min_poll_interval, heartbeat_timeout / 10)
        self.poll_timeout = max(poll_duration, min(min_poll_interval, 0.1))
        self.member = uuid.uuid4().hex
        self.epoch = 0
        self._assigned = False  # partition 0 is ours according to the last rebalance callback
        self._confirmed_until = 0.0  # monotonic: our own heartbeat was seen, valid until then
        self._leading = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listener: ElectionListener | None = None
        self._error: BaseException | None = None

    def start(self, listener: ElectionListener) -> None:
        self._listener = listener
        self._ensure_topic()
        self._thread = threading.Thread(target=self._run, name="sluice-neli", daemon=True)
        self._thread.start()

    def is_leader(self) -> bool:
        return self._leading and self._assigned and time.monotonic() < self._confirmed_until

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
        except Exception as exc:  # already exists (a rival created it first) is fine
            if "exist" not in str(exc).lower():
                log.warning("could not create leader topic %s: %s", self.topic, exc)

    def _run(self) -> None:
        from confluent_kafka import Consumer, Producer

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
        consumer.subscribe(
            [self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_revoke
        )
        next_beat = 0.0
        next_topic_check = 0.0
        try:
            while not self._stop.is_set():
                msg = consumer.poll(self.poll_timeout)
                now = time.monotonic()
                error = msg.error() if msg is not None else None
                if error is not None and now >= next_topic_check:
                    # A broker that lost its state (or a deleted topic): put the leader topic back.
                    log.debug("NELI consumer: %s", error)
                    if "UNKNOWN_TOPIC" in error.name():
                        self._ensure_topic()
                    next_topic_check = now + 1.0
                own_beat = (
                    msg is not None
                    and error is None
                    and msg.partition() == 0
                    and msg.value() == self._beat_value()
                )
                if own_beat and self._assigned:
                    self._confirmed_until = now + self.heartbeat_timeout
                    if not self._leading:
                        self._leading = True
                        self.epoch += 1
                        log.info("NELI: leader of group %s (member %s)", self.group_id, self.member)
                        if self._listener:
                            self._listener.leader_acquired(self.epoch)
                if self._assigned and now >= next_beat:
                    try:
                        producer.produce(self.topic, value=self._beat_value(), partition=0)
                    except Exception as exc:  # BufferError when the broker is away: keep trying
                        log.debug("heartbeat not queued: %s", exc)
                    next_beat = now + self.heartbeat_interval
                producer.poll(0)
                if self._leading and now >= self._confirmed_until:
                    self._leading = False
                    log.warning("NELI: no heartbeat seen within %.1fs: fencing", self.heartbeat_timeout)
                    if self._listener:
                        self._listener.leader_fenced()
        except BaseException as exc:
            self._error = exc
            log.exception("NELI election thread failed")
        finally:
            was_leading = self._leading
            self._leading = False
            self._assigned = False
            try:
                consumer.close()  # leaves the group: a rival is assigned partition 0 promptly
            except Exception:
                log.debug("consumer close failed", exc_info=True)
            producer.flush(1)
            if was_leading and self._listener:
                self._listener.leader_revoked()

    def _beat_value(self) -> bytes:
        return f"heartbeat:{self.member}".encode()

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self._assigned = any(p.topic == self.topic and p.partition == 0 for p in partitions)
        if self._assigned:
            log.info("NELI: assigned partition 0 of %s; confirming with a heartbeat", self.topic)

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        if any(p.topic == self.topic and p.partition == 0 for p in partitions):
            self._assigned = False
            if self._leading:
                self._leading = False
                log.info("NELI: partition 0 revoked")
                if self._listener:
                    self._listener.leader_revoked()
