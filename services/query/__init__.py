"""HTTP query: any processor's tables, aggregates and windows, with freshness and consistency."""
