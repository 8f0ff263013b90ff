"""sales_native: paid sales per currency per minute, as a Spark-native DataFrame processor."""
