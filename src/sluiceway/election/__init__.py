"""Leader election behind one small protocol: Kafka (NELI) or a database lease."""
