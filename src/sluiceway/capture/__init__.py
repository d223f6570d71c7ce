"""``sluice capture``: PostgreSQL change data capture to Kafka, NATS JetStream, RabbitMQ, Redis
Streams or a journal — no JVM, no Spark. One daemon per replication slot, leader-elected.

>>> from sluiceway.capture import Capture, CaptureConfig      # doctest: +SKIP
"""

from sluiceway.capture.config import CaptureConfig
from sluiceway.capture.daemon import Capture
from sluiceway.capture.target import DeliveryFailed, PublishTarget, UndeliverableChange

__all__ = ["Capture", "CaptureConfig", "DeliveryFailed", "PublishTarget", "UndeliverableChange"]
