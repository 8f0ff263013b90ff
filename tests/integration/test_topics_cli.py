"""`refold topics` creates every topic a processor writes, before any processor runs.

A consumer started first (``refold webhooks run`` on a pattern processor's insights, ``refold
tail``) then finds its topic instead of failing with ``OFFSETS_UNAVAILABLE``.
"""

from __future__ import annotations

from confluent_kafka.admin import AdminClient

from refold.deploy.cli import main as refold


def test_refold_topics_creates_insights_windows_and_dead_letter_topics_as_configured(
    kafka_bootstrap, unique, monkeypatch, capsys
):
    # Each processor's options name its topics: none of these exists before the command.
    insights, windows, dead = f"ins-{unique}", f"win-{unique}", f"dlq-{unique}"
    monkeypatch.setenv("REFOLD_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("REFOLD_ORDER_ALERTS__INSIGHTS_TOPIC", insights)
    monkeypatch.setenv("REFOLD_SALES_WINDOWS__WINDOWS_TOPIC", windows)
    monkeypatch.setenv("REFOLD_ORDER_STATE__DEAD_LETTER_TOPIC", dead)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    try:
        # A set's topics and what the processors that read them write
        assert refold(["topics", "web"]) == 0
        printed = {line.split()[0] for line in capsys.readouterr().out.splitlines()}
        assert "web.pageviews" in printed
        assert not {insights, windows, dead} & printed  # they read commerce.orders
        assert refold(["topics", "commerce"]) == 0
        printed = {line.split()[0] for line in capsys.readouterr().out.splitlines()}
        assert {insights, windows, dead} <= printed
        assert {insights, windows, dead} <= set(admin.list_topics(timeout=10).topics)
        assert refold(["topics"]) == 0  # all sets, every processor
        printed = {line.split()[0] for line in capsys.readouterr().out.splitlines()}
        assert {insights, windows, dead, "web.pageviews"} <= printed
    finally:
        for future in admin.delete_topics([insights, windows, dead]).values():
            future.exception(timeout=30)
