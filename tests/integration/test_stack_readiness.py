"""``refold up`` returns only when the broker's coordinators answer (deploy/kafka_ready.py).

Real servers: a fresh local stack of its own (the session's broker is warm already), then, at
once, what a user's next command does in a process of its own: transactional producers (the
dead-letter and output topics' writers) and consumer group commits (the dispatcher's copy of
its positions), over ids that map to every partition of Kafka's internal topics. Not one of
them may meet "Coordinator load in progress" or NOT_COORDINATOR.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from refold.deploy.kafka_ready import ids_for_every_partition
from refold.deploy.local_stack import LocalStack, free_port

_FIRST_CLIENTS = textwrap.dedent(
    """
    import sys
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    bootstrap, transactional_ids, groups = sys.argv[1], sys.argv[2], sys.argv[3]
    conf = {"bootstrap.servers": bootstrap}
    for transactional_id in transactional_ids.split(","):
        producer = Producer({**conf, "transactional.id": transactional_id})
        producer.init_transactions(30)
        producer.poll(0)
    admin = AdminClient(conf)
    admin.create_topics([NewTopic("first", 1, 1)])["first"].result(30)
    for group in groups.split(","):
        consumer = Consumer({**conf, "group.id": group, "enable.auto.commit": False})
        consumer.commit(offsets=[TopicPartition("first", 0, 0)], asynchronous=False)
        consumer.close()
    print("ok")
    """
)


def test_the_first_clients_after_up_meet_no_coordinator_loading(tmp_path):
    stack = LocalStack(tmp_path, kafka_port=free_port(), redis_port=free_port())
    stack.start()
    try:
        clients = subprocess.run(
            [
                sys.executable,
                "-c",
                _FIRST_CLIENTS,
                stack.bootstrap_servers,
                ",".join(ids_for_every_partition("user-tx", 4)),
                ",".join(ids_for_every_partition("user-group", 8)),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        stack.stop()
    assert clients.returncode == 0, clients.stderr
    assert clients.stdout.strip() == "ok"
    assert "load in progress" not in clients.stderr.lower()
    assert "COORDINATOR" not in clients.stderr, clients.stderr
