"""Kafka client code shared by processors, replay and services: offsets and topic admin.

Live clients (sockets), kept apart from the pure kernel in ``contracts``.
"""
