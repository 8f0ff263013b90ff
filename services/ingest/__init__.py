"""HTTP ingest: ``POST /v1/events`` validates events against their contracts and publishes them."""
