"""Machinery shared by every processor: Kafka source, Redis sink, runner."""
