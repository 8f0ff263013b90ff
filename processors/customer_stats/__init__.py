"""customer_stats: per-customer order statistics, re-keyed from order-keyed events."""
