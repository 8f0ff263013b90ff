"""archive: every event of the reference topics as Parquet, one table per event type."""
