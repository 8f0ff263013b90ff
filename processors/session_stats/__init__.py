"""session_stats: per web session, page views, searches and clicks (co-partitioned topics)."""
