"""Reading materialized state through the live-generation alias."""
