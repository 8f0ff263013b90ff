"""sales_windows: paid sales per currency in tumbling, hopping and sliding event-time windows."""
