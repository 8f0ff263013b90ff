"""Watching refold: processors, generations, lag, replays, stats, ``/metrics`` and ``/health``.

- :mod:`services.monitor.routes`: the HTTP routes (``monitor_router``).
- :mod:`services.monitor.status`: what they read, from Redis and the broker (:class:`Monitor`).
- :mod:`services.monitor.views`: its values (processors, generations, lag, stalls).
- :mod:`services.monitor.lag`: cached, time-bounded answers of the broker.
- :mod:`services.monitor.tracking`: stall detection and replay rates (pure).
- :mod:`services.monitor.metrics`: the Prometheus collector.
"""
