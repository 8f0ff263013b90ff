"""Services: the producer SDK and the state reader."""
