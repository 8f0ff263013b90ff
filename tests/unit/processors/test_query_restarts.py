"""Which query failures a processor starts its query again after, and which stop it."""

from __future__ import annotations

from refold.processors.runtime.query_loop import RestartBudget, transient_failure

# As `make test` logged it: customer_orders' query failed before its first batch.
_NOT_CONNECTED = (
    "Python worker failed to connect back.\n=== Streaming Query ===\n"
    "Identifier: customer_orders_g1 [id = bd222e28, runId = 95d5bb5d]\n"
    "Current Committed Offsets: {}\nCurrent Available Offsets: {}\n\n"
    "Current State: INITIALIZING\nThread State: RUNNABLE"
)
_SPARK_55271 = (
    'Cannot invoke "Object.getClass()" because the return value of "scala.Option.get()" is null'
)


def test_a_python_worker_that_did_not_connect_back_is_a_restart_whatever_the_source():
    for source in ("refold_kafka", "kafka"):
        reason = transient_failure(Exception(_NOT_CONNECTED), source)
        assert reason is not None
        assert "did not connect back" in reason


def test_spark_55271_is_a_restart_only_for_sparks_kafka_source():
    assert "SPARK-55271" in (transient_failure(Exception(_SPARK_55271), "kafka") or "")
    assert transient_failure(Exception(_SPARK_55271), "refold_kafka") is None


def test_other_failures_stop_the_processor():
    failure = Exception("ZeroDivisionError: division by zero (in the user's fold)")
    assert transient_failure(failure, "refold_kafka") is None


def test_restarts_in_a_row_use_up_the_budget():
    budget = RestartBudget(limit=3)
    stuck = ({"orders/0": 120}, 7)  # no batch committed between the restarts
    assert [budget.spend(stuck) for _ in range(4)] == [True, True, True, False]
    assert budget.in_a_row == 4


def test_a_committed_batch_between_restarts_starts_the_count_again():
    budget = RestartBudget(limit=3)
    for batch in range(10):  # a long run: a restart after every batch, never two in a row
        assert budget.spend(({"orders/0": 100 * batch}, batch))
    assert budget.in_a_row == 1
    assert budget.spend(({"orders/0": 900}, 9))
    assert budget.in_a_row == 2


def test_restarts_in_a_row_wait_longer_each_time():
    budget = RestartBudget(limit=5)
    pauses = []
    for _ in range(5):
        budget.spend(({"orders/0": 120}, 7))
        pauses.append(budget.pause_s())
    assert pauses == [5.0, 10.0, 20.0, 40.0, 40.0]
    budget.spend(({"orders/0": 400}, 8))  # a batch committed since: the first pause again
    assert budget.pause_s() == 5.0
