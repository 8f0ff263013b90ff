"""The HTTP services as one ASGI app: ingest, query, control, metrics, health, dashboard."""
