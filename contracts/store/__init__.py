"""Redis client code shared by processors, replay and services: generations and leases.

Live clients (sockets, a renewal thread), kept apart from the pure kernel in ``contracts``.
"""
