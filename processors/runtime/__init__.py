"""The runtime around a fold: Kafka source, the exactly-once Redis envelope, Spark wiring."""
