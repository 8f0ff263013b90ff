"""The order-state processor: commerce.orders folded into per-order state."""
