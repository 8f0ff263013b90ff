"""The Parquet archive, one room: its sink and writer, store, maintenance, CLI and cold tier.

``cold_tier`` is what a replay reads below a partition's log start.
"""
