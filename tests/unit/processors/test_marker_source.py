"""A fold over an output stream with watermark markers is refused a source without headers."""

from __future__ import annotations

import pytest

from refold.contracts.commerce import ORDER_CHANGES, ORDERS
from refold.contracts.processors import ProcessorOptions
from refold.processors.customer_alerts.projection import build
from refold.processors.errors import ProcessorConfigError
from refold.processors.runtime.run_checks import check_marker_source
from refold.processors.runtime.run_plan import RunOptions
from refold.processors.sales_native.projection import SalesNative


def _options(source_format: str) -> RunOptions:
    return RunOptions(checkpoint_root="/nonexistent", source_format=source_format)  # type: ignore[arg-type]


@pytest.mark.parametrize("source_format", ["kafka", "refold_kafka"])
def test_a_row_source_over_a_marked_stream_is_refused_naming_the_fix(source_format):
    with pytest.raises(ProcessorConfigError) as refused:
        check_marker_source(build(ProcessorOptions()), [ORDER_CHANGES], _options(source_format))
    message = str(refused.value)
    assert ORDER_CHANGES.name in message
    assert "refold_kafka_ranges" in message


def test_the_ranges_source_a_plain_topic_and_engines_that_skip_markers_pass():
    fold = build(ProcessorOptions())
    check_marker_source(fold, [ORDER_CHANGES], _options("refold_kafka_ranges"))
    check_marker_source(fold, [ORDERS], _options("kafka"))
    check_marker_source(SalesNative(), [ORDER_CHANGES], _options("kafka"))
