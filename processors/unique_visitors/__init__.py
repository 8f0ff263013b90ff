"""unique_visitors: distinct visitors per hour (HyperLogLog), any range of hours on demand."""
