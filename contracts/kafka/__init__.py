"""Kafka client code shared by processors, replay and services: offsets, topic admin, outputs.

Live clients (sockets), kept apart from the pure kernel in ``contracts``.
"""
