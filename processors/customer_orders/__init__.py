"""customer_orders: a processor of customers over order_state's output stream (a chain)."""
