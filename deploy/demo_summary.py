"""What the demo prints about its processors' state: customers, sessions, event-time processors.

Read from Redis with :class:`~refold.services.reader.state_reader.StateReader` and
:class:`~refold.services.reader.window_reader.WindowReader`, as any reading app does.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import cast

import redis

from refold.contracts.layout import StateLayout, parse_position_field
from refold.deploy.simulators.orders import SimulatedEvent
from refold.processors.fold.lookups import EXPIRED, PENDING_TIMERS, as_of
from refold.processors.sales_windows.projection import SalesWindows
from refold.processors.search_ctr.projection import ctr
from refold.processors.unique_visitors.projection import ALL, UniqueVisitors
from refold.services.reader.state_reader import StateReader
from refold.services.reader.window_reader import WindowReader

__all__ = ["clock", "money", "platform_summary", "windows_summary"]


def money(minor: int) -> str:
    """Minor units as ``1,234.56``."""
    return f"{minor / 100:,.2f}"


def platform_summary(client: redis.Redis, order_events: Sequence[SimulatedEvent]) -> None:
    """customer_stats' top spenders with their profiles, an as-of example, session_stats."""
    customers = dict(StateReader(client, "customer_stats").scan("customers"))
    print(f"customer_stats (re-keyed by customer_id): {len(customers):,} customers; top spenders:")
    spend = sorted(customers.values(), key=lambda c: -sum(c["spend_minor"].values()) if c else 0)
    for state in spend[:3]:
        spent = ", ".join(f"{money(v)} {c}" for c, v in sorted(state["spend_minor"].items()))
        profile = state.get("profile") or {}
        name = f"{profile.get('name', '(no profile yet)')} ({profile.get('tier', '-')})"
        print(
            f"  {state['customer_id']}  {name:<30} {state['orders']} orders, "
            f"{state['paid']} paid, {state['cancelled']} cancelled; spend {spent}"
        )
    _as_of_example(client, order_events)
    sessions = StateReader(client, "session_stats").aggregate("session_totals").value
    print(
        f"session_stats: {sessions.get('sessions', 0):,} sessions "
        f"({sessions.get('identified', 0):,} signed in), {sessions.get('page_views', 0):,} page "
        f"views, {sessions.get('searches', 0):,} searches, {sessions.get('clicks', 0):,} clicks"
    )


def clock(ms: int) -> str:
    """``HH:MM`` (UTC) of an event time."""
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%H:%M")


def windows_summary(client: redis.Redis) -> None:
    """The event-time processors: the last closed minutes of sales, unique visitors per hour."""
    sales = WindowReader.from_fold(client, SalesWindows(), lateness_ms=30_000)
    watermark = sales.watermark().value.watermark
    groups = sales.groups("per_minute").value
    if watermark is None or not groups:
        print("sales_windows: no payment yet")
        return
    since = watermark - 5 * 60_000
    recent = {g: sales.range("per_minute", g, since, watermark).value for g in groups}
    busiest = max(groups, key=lambda g: sum(m["count"] for m in recent[g]))
    print(
        f"sales_windows (event time, watermark {clock(watermark)}): the last closed minutes "
        f"of {busiest} sales"
    )
    for minute in recent[busiest][-3:]:
        span = f"{clock(minute['start'])}-{clock(minute['end'])}"
        print(
            f"  {span}  {minute['count']:>3} payments  sum {money(minute['sum:amount_minor'])}  "
            f"avg {money(int(minute['avg:amount_minor']))}  "
            f"max {money(minute['max:amount_minor'])}"
        )
    sliding = sales.window("five_minutes_sliding", busiest, watermark - watermark % 10_000).value
    print(f"  the five minutes before the watermark (sliding by 10 s): {sliding['count']} payments")
    visitors = WindowReader.from_fold(client, UniqueVisitors(), lateness_ms=60_000)
    seen = visitors.watermark().value.clocks.values()
    if not seen:
        print("unique_visitors: no page view yet")
        return
    newest = max(seen)
    day_start = newest - 24 * 3_600_000
    hours = visitors.range("hourly", ALL, day_start, newest + 3_600_000).value
    day = visitors.distinct("hourly", "visitors", ALL, day_start, newest + 1).value
    per_hour = ", ".join(f"{clock(h['start'])} {h['distinct:visitors']}" for h in hours[:6])
    print(f"unique_visitors (HyperLogLog): {day:,} distinct visitors in the last 24 h")
    print(f"  per hour: {per_hour}")
    visits = StateReader(client, "web_sessions").aggregate("visit_totals").value
    closed = visits.get("closed", 0)
    average = visits.get("closed_ms", 0) / max(closed, 1) / 60_000
    print(
        f"web_sessions (session windows, gap 30 min): {visits.get('visits', 0):,} visits, "
        f"{closed:,} closed (average {average:.1f} min), {visits.get('open', 0):,} still open"
    )
    rates = ctr(StateReader(client, "search_ctr").aggregate("ctr").value)
    top = sorted(rates.items(), key=lambda item: -item[1][0])[:3]
    shown = ", ".join(f"{term!r} {c}/{s} ({r:.0%})" for term, (s, c, r) in top)
    print(f"search_ctr (searches joined with clicks within 10 min): top terms {shown}")
    clicks = StateReader(client, "enriched_clicks").aggregate("clicks_by_customer").value
    tiers = ", ".join(
        f"{name[5:]} {count}" for name, count in sorted(clicks.items()) if name.startswith("tier:")
    )
    waiting = client.zcard(
        StateLayout("enriched_clicks")
        .generation(StateReader(client, "enriched_clicks").live_generation())
        .timers(PENDING_TIMERS)
    )
    print(
        f"enriched_clicks (clicks joined with the profile as of the click): "
        f"{clicks.get('clicks', 0):,} joined ({clicks.get('anonymous', 0):,} anonymous), "
        f"by tier: {tiers}; {waiting:,} wait for customer_profiles' watermark{_quietest(client)}"
    )


def _quietest(client: redis.Redis) -> str:
    """Which partition of the table holds its watermark back, and since when."""
    live = StateReader(client, "customer_profiles").live_generation()
    keys = StateLayout("customer_profiles").generation(live)
    raw = cast("dict[bytes, bytes]", client.hgetall(keys.clocks))
    clocks = {k.decode(): int(v) for k, v in raw.items() if parse_position_field(k.decode())}
    if not clocks:
        return ""
    field, newest = min(clocks.items(), key=lambda item: item[1])
    return f" (its slowest partition, {field}, has no account event after {clock(newest)})"


def _as_of_example(client: redis.Redis, order_events: Sequence[SimulatedEvent]) -> None:
    """A customer whose tier changed between orders: each order with the tier it had then."""
    placed: dict[str, list[tuple[int, str]]] = {}
    for event_type, event in order_events:
        if event_type == "OrderPlaced":
            order = (int(event["placed_at"]), str(event["order_id"]))
            placed.setdefault(str(event["customer_id"]), []).append(order)
    rows = StateReader(client, "customer_profiles").get_many("profiles", sorted(placed)).value
    found: list[tuple[bool, int, str]] = []
    for customer, row in rows.items():
        if row is None:
            continue
        latest = row["versions"][-1][1]["tier"]
        past = [as_of(row, at) for at, _ in placed[customer]]
        tiers = {p["tier"] for p in past if p is not None and p is not EXPIRED}
        if tiers - {latest}:  # prefer orders on both sides of a change, then more orders
            found.append((latest not in tiers, -len(placed[customer]), customer))
    if not found:
        print("customer_profiles: no customer changed tier between two of their orders")
        return
    customer = min(found)[-1]
    row = rows[customer]
    changes: list[str] = []
    tier: str | None = None
    for at, version in row["versions"]:
        if version["tier"] != tier:
            tier = version["tier"]
            changes.append(f"{tier} from {clock(at)}")
    print(
        f"orders as of their time (customer_profiles' versions read with as_of, as enriched_clicks "
        f"joins clicks): {customer} {row['versions'][-1][1]['name']} was {', '.join(changes)}"
    )
    for at, order_id in sorted(placed[customer])[:6]:
        profile = as_of(row, at)
        then = "(no account yet)" if profile in (None, EXPIRED) else profile["tier"]
        note = "" if then == tier else f"  (its latest profile says {tier})"
        print(f"  {order_id} placed {clock(at)}: {then}{note}")
