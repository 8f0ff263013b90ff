"""The topics a processor writes, named once for its start and for `refold topics`."""

from __future__ import annotations

from refold.contracts.processors import EventTime, ProcessorOptions
from refold.contracts.topics import TopicSpec
from refold.processors.fold.patterns import PatternOptions
from refold.processors.order_alerts.projection import build as order_alerts
from refold.processors.order_state.config import OrderStateOptions
from refold.processors.order_state.projection import build as order_state
from refold.processors.runtime.output_topics import late_topic, output_topic_specs, output_topics
from refold.processors.sales_windows.projection import build as sales_windows

_LATE = EventTime(field="at", late="side-output")


def test_a_pattern_processor_writes_its_insights_and_a_window_fold_its_windows() -> None:
    alerts = order_alerts(PatternOptions(insights_topic="my.insights"))
    assert output_topics(alerts, None, None) == ["my.insights"]
    windows = sales_windows(ProcessorOptions())
    assert output_topics(windows, None, None) == ["sales_windows.windows"]
    assert output_topics(windows, None, "w") == ["w"]


def test_a_side_output_policy_adds_the_late_topic_and_accept_does_not() -> None:
    state = order_state(OrderStateOptions())
    effects = list(state.effect_topics)  # its output stream of status changes
    assert output_topics(state, _LATE, None) == [*effects, "order_state.late"]
    assert output_topics(state, EventTime(field="at", late="accept"), None) == effects
    assert late_topic("p", EventTime(field="at", late="side-output", late_topic="x")) == "x"


def test_an_output_stream_declared_by_a_contract_set_keeps_its_spec() -> None:
    declared = {"s": TopicSpec("s", 8, "customer_id", ("E",))}
    specs = output_topic_specs(["s", "other"], declared)
    assert specs[0] is declared["s"]
    assert (specs[1].name, specs[1].partitions) == ("other", 4)
