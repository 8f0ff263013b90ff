"""``python -m bench peers`` (``make bench-peers``): refold side by side with its peers.

The same job for every engine: the benchmark's order backlog (refold's Avro encoding, 8
partitions) folded into order_state's per-key state, every final state checked against refold's
plain-Python oracle. The orchestrator (:mod:`bench.peers.run`) runs in refold's venv; the Python
peers run in ``.venv-peers`` (Quix Streams pins an older confluent-kafka than refold's), the JVM
peers on the jars ``make setup`` fetched into ``.jars/``.
"""
