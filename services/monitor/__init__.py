"""Watching refold: processors, generations, lag, replays, stats, ``/metrics`` and ``/health``.

- :mod:`refold.services.monitor.routes`: the HTTP routes (``monitor_router``).
- :mod:`refold.services.monitor.status`: what they read, from Redis and the broker
  (:class:`Monitor`).
- :mod:`refold.services.monitor.views`: its values (processors, generations, lag, stalls).
- :mod:`refold.services.monitor.lag`: cached, time-bounded answers of the broker.
- :mod:`refold.services.monitor.tracking`: stall detection and replay rates (pure).
- :mod:`refold.services.monitor.metrics`: the Prometheus collector.
"""
