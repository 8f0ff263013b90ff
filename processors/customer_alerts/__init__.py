"""customer_alerts: patterns per customer over order_state's status changes (processors chain)."""
