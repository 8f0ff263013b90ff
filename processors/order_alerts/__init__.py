"""order_alerts: patterns per order (paid but not shipped in time; paid then cancelled)."""
