"""The pure fold API: projections, fold records and the oracle. No Spark, Redis or Kafka."""
