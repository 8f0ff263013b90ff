"""The dashboard in a real headless browser (Debian's chromium + chromedriver, via selenium).

The real app (``create_app``) runs under uvicorn on a loopback port, against the real broker
and Redis, with API keys on. A processor's generations, positions and stats are written to
Redis under a unique key prefix; the page, opened with a query key in its URL fragment, must
show the same figures as the JSON API, follow changes within a few refreshes, and is saved as
a screenshot (in the test's tmp dir; with REFOLD_UPDATE_SCREENSHOT=1 also docs/img/dashboard.png,
the image in docs/serving.md).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from refold.contracts.layout import StateLayout
from refold.contracts.settings import KafkaSettings, RedisSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.store.stats import ProcessorStats
from tests.support.served import served as serve_app
from tests.support.waiting import answer_within_budget, assert_eventually

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "dashboard.png"
PROCESSOR = "order_state"  # a registered processor: the monitor lists the registry's
PARTITIONS = 3
RECORDS_PER_PARTITION = 2000
LIVE_START = (1500, 1000, 500)  # the live generation's positions: it lags 500, 1000, 1500
BUILD_START = 300  # the building generation's position on every partition
STEP = 50  # each refresh the live generation moves this far on every partition
REFRESH_TIMEOUT_S = 20.0  # the page polls every 2 s; a few refreshes, on a loaded machine

# Everything the page shows, read in one script so that no refresh lands in between.
_READ_PAGE = """
const root = document.getElementById("dashboard");
const all = (sel, node) => Array.from((node || document).querySelectorAll(sel));
return {
  state: root.dataset.state,
  refreshes: Number(root.dataset.refreshes),
  status: document.getElementById("status").textContent,
  auth: document.getElementById("auth-message").hidden ? null
        : document.getElementById("auth-message").innerText,
  summary: Object.fromEntries(all("[data-summary]").map(n => [n.dataset.summary, n.dataset.value])),
  processors: all("article[data-processor]").map(card => ({
    name: card.dataset.processor,
    live: card.dataset.liveGeneration,
    lagRecords: card.dataset.lagRecords,
    throughput: card.dataset.throughput,
    events: card.dataset.events,
    sparkPoints: all("svg[data-chart=throughput] polyline", card).map(
        p => p.getAttribute("points").split(" ").length),
    generations: all("li[data-generation]", card).map(g => ({
      generation: Number(g.dataset.generation), status: g.dataset.status,
      applied: g.dataset.applied, lagRecords: g.dataset.lagRecords})),
    partitions: all("tr[data-topic]", card).map(r => ({
      topic: r.dataset.topic, partition: Number(r.dataset.partition),
      position: r.dataset.position, end: r.dataset.end,
      lagRecords: r.dataset.lagRecords, lagSeconds: r.dataset.lagSeconds})),
  })),
  dead: all("tr[data-dead-reason]").map(r => ({
    processor: r.dataset.deadProcessor, generation: Number(r.dataset.deadGeneration),
    reason: r.dataset.deadReason, count: Number(r.dataset.deadCount)})),
  replays: all("[data-replay-processor]").map(r => ({
    processor: r.dataset.replayProcessor, generation: Number(r.dataset.replayGeneration),
    done: r.dataset.replayDone, total: r.dataset.replayTotal,
    percent: r.dataset.replayPercent, etaS: r.dataset.replayEtaS})),
};
"""


def _number(text: str) -> int | None:
    return None if text == "" else int(float(text))


@dataclass
class Served:
    """The app under uvicorn, and what the test needs to drive it."""

    base_url: str
    client: redis.Redis
    key_prefix: str

    def get(self, key: str, path: str) -> httpx.Response:
        return httpx.get(
            f"{self.base_url}{path}", headers={"Authorization": f"Bearer {key}"}, timeout=30
        )

    def api(self, key: str, path: str) -> Any:
        response = self.get(key, path)
        response.raise_for_status()
        return response.json()


@pytest.fixture
def served(kafka_bootstrap: str, redis_url: str, unique: str) -> Iterator[Served]:
    from refold.services.api.app import create_app
    from refold.services.api.config import HttpSettings, ServeSettings

    prefix = f"test-{unique}"
    settings = ServeSettings(
        kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap),
        redis=RedisSettings(url=redis_url, key_prefix=prefix),
        serve=HttpSettings(auth="keys"),
    )
    client = redis_client(redis_url)
    try:
        with serve_app(create_app(settings)) as url:
            yield Served(url, client, prefix)
    finally:
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            client.delete(key)
        client.close()


@pytest.fixture
def browser() -> Iterator[Any]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        # Not a skip: `make setup` installs them, so a missing browser is a broken setup.
        pytest.fail(
            f"{CHROMIUM} and {CHROMEDRIVER} are needed (`make setup` installs them: "
            "apt-get install chromium chromium-driver)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
    ):
        options.add_argument(flag)
    # An explicit driver path: Selenium Manager (which downloads drivers) never runs.
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    # The viewport itself 1280x900 (the window size includes the browser's frame).
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False},
    )
    try:
        yield driver
    finally:
        driver.quit()


def _produce(bootstrap: str, topic: str) -> None:
    """RECORDS_PER_PARTITION records on every partition, their CreateTime a minute ago."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    created = int(time.time() * 1000) - 60_000
    for partition in range(PARTITIONS):
        for i in range(RECORDS_PER_PARTITION):
            producer.produce(
                topic, value=b"{}", key=f"k{i}".encode(), partition=partition, timestamp=created
            )
    assert producer.flush(30) == 0


class _Batches:
    """Counts micro-batches of a generation as the Spark driver does (ProcessorStats)."""

    def __init__(self, served: Served, generation: int) -> None:
        self.stats = ProcessorStats(served.client, StateLayout(PROCESSOR, served.key_prefix))
        self.generation = generation
        self.batch_id = -1

    def record(self, events: int, dead_letters: dict[str, int] | None = None) -> None:
        self.batch_id += 1
        assert self.stats.record_batch(
            self.generation,
            self.batch_id,
            events,
            0,
            events // 10,
            dead_letters or {},
            120.0,
            None,
            now_ms=int(time.time() * 1000),
        )


def _positions(topic: str, offsets: Sequence[int]) -> dict[str, int]:
    return {f"{topic}/{p}": offset for p, offset in enumerate(offsets)}


@pytest.fixture
def monitored(
    served: Served, kafka_bootstrap: str, make_topic: Callable[..., str]
) -> dict[str, Any]:
    """order_state with a live generation lagging behind and a building one (a replay)."""
    topic = make_topic(partitions=PARTITIONS, prefix="dash")
    _produce(kafka_bootstrap, topic)
    registry = GenerationRegistry.of(served.client, PROCESSOR, served.key_prefix)
    # The meta names the test's own topic: the monitor reads a generation's topics from its
    # meta, where the processor runner records them (else from the processor's spec).
    live = registry.create({"topics": [topic]}, live=True)
    registry.set_positions(live, _positions(topic, LIVE_START))
    batches = _Batches(served, live)
    batches.record(2000, {"invalid-event": 3})  # events == records applied by the positions
    batches.record(sum(LIVE_START) - 2000, {"invalid-event": 0, "schema-unknown": 2})
    building = registry.create({"topics": [topic]})
    registry.set_positions(building, _positions(topic, (BUILD_START,) * PARTITIONS))
    _Batches(served, building).record(BUILD_START * PARTITIONS)
    return {
        "topic": topic,
        "registry": registry,
        "live": live,
        "building": building,
        "batches": batches,
    }


def _api_key(served: Served, *scopes: str) -> str:
    from refold.services.auth import ApiKeyStore

    return ApiKeyStore(served.client, served.key_prefix).add(
        f"dashboard-{'-'.join(scopes)}", scopes
    )


def _read(browser: Any) -> dict[str, Any]:
    page: dict[str, Any] = browser.execute_script(_READ_PAGE)
    return page


def _card(page: dict[str, Any], name: str) -> dict[str, Any]:
    cards: list[dict[str, Any]] = [c for c in page["processors"] if c["name"] == name]
    assert len(cards) == 1, page["processors"]
    return cards[0]


def _refreshed(browser: Any, after: int) -> dict[str, Any]:
    """The page once it has refreshed more than ``after`` times (else AssertionError)."""
    page = _read(browser)
    assert page["state"] == "ok", page["status"]
    assert page["refreshes"] > after
    return page


def _known(browser: Any) -> dict[str, Any]:
    """The page once it has refreshed with the broker's figures known.

    The monitor answers within a broker budget and leaves a figure out when the log ends came
    too late (a busy machine's first ListOffsets); a later refresh has them.
    """
    page = _refreshed(browser, 0)
    assert page["replays"]
    assert all(r["done"] != "" and r["total"] != "" for r in page["replays"]), page["replays"]
    partitions = _card(page, PROCESSOR)["partitions"]
    assert partitions
    assert all(p["end"] != "" for p in partitions), partitions
    return page


def _refused(browser: Any, status: int) -> dict[str, Any]:
    """The page once it shows the key guidance for an answer ``status``."""
    page = _read(browser)
    assert page["state"] == "auth"
    assert str(status) in page["status"]
    return page


def _assert_matches_api(page: dict[str, Any], served: Served, key: str) -> None:
    """The page's figures equal the JSON API's (lag seconds within the time between reads)."""
    listing = served.api(key, "/v1/processors")["processors"]
    assert sorted(c["name"] for c in page["processors"]) == sorted(p["name"] for p in listing)
    for proc in listing:
        card = _card(page, proc["name"])
        live = proc["live_generation"]
        assert card["live"] == ("" if live is None else str(live))
        assert sorted((g["generation"], g["status"]) for g in card["generations"]) == sorted(
            (g["generation"], g["status"]) for g in proc["generations"]
        )
    lag = answer_within_budget(lambda: served.get(key, f"/v1/processors/{PROCESSOR}/lag"))
    card = _card(page, PROCESSOR)
    assert _number(card["lagRecords"]) == lag["lag_records"]
    shown = {(p["topic"], p["partition"]): p for p in card["partitions"]}
    assert set(shown) == {(p["topic"], p["partition"]) for p in lag["partitions"]}
    for part in lag["partitions"]:
        row = shown[part["topic"], part["partition"]]
        assert _number(row["lagRecords"]) == part["lag_records"]
        assert _number(row["position"]) == part["position"]
        assert _number(row["end"]) == part["end"]
        # The record timestamps behind lag seconds are probed in the background: the page may
        # have been drawn before the probe answered, the API call after it.
        if part["lag_seconds"] is not None and row["lagSeconds"] != "":
            assert abs(float(row["lagSeconds"]) - part["lag_seconds"]) < REFRESH_TIMEOUT_S
    stats = served.api(key, f"/v1/processors/{PROCESSOR}/stats")["generations"]
    live_stats = next(g for g in stats if str(g["generation"]) == card["live"])
    assert _number(card["events"]) == live_stats["events"]
    assert sorted(
        (d["reason"], d["count"]) for d in page["dead"] if d["processor"] == PROCESSOR
    ) == sorted((reason, n) for reason, n in live_stats["dead_letters"].items() if n)
    replays = served.api(key, "/v1/replays")["replays"]
    assert sorted(
        (r["processor"], r["generation"], _number(r["done"]), _number(r["total"]))
        for r in page["replays"]
    ) == sorted((r["processor"], r["generation"], r["done"], r["total"]) for r in replays)


def test_dashboard_shows_the_api_figures_and_follows_them(
    served: Served, monitored: dict[str, Any], browser: Any, tmp_path: Path
) -> None:
    key = _api_key(served, "query")
    topic, registry, live = monitored["topic"], monitored["registry"], monitored["live"]
    browser.get(f"{served.base_url}/dashboard#key={key}")

    # The key leaves the address bar once the page has it.
    assert "key=" not in browser.current_url
    page = assert_eventually(
        lambda: _known(browser), timeout=REFRESH_TIMEOUT_S, message="a refresh with figures"
    )
    _assert_matches_api(page, served, key)
    card = _card(page, PROCESSOR)
    assert card["live"] == str(live)
    assert {(p["topic"], p["partition"]): _number(p["lagRecords"]) for p in card["partitions"]} == {
        (topic, p): RECORDS_PER_PARTITION - LIVE_START[p] for p in range(PARTITIONS)
    }
    assert sorted((d["reason"], d["count"]) for d in page["dead"]) == [
        ("invalid-event", 3),
        ("schema-unknown", 2),
    ]
    assert {d["processor"] for d in page["dead"]} == {PROCESSOR}
    assert page["summary"]["dead-letters"] == "5"
    assert [(r["processor"], r["generation"]) for r in page["replays"]] == [
        (PROCESSOR, monitored["building"])
    ]

    # Throughput: the stats' events grow between refreshes, the page derives events/s; the
    # replay moves on too (the monitor derives its rate and ETA).
    building = monitored["building"]
    for step in range(1, 5):
        seen = _read(browser)["refreshes"]
        monitored["batches"].record(STEP * PARTITIONS)
        registry.set_positions(live, _positions(topic, [at + STEP * step for at in LIVE_START]))
        building_at = BUILD_START + 4 * STEP * step
        registry.set_positions(building, _positions(topic, (building_at,) * PARTITIONS))
        assert_eventually(partial(_refreshed, browser, seen), timeout=REFRESH_TIMEOUT_S)
    page = _read(browser)
    card = _card(page, PROCESSOR)
    assert float(card["throughput"]) > 0
    assert card["sparkPoints"]
    assert card["sparkPoints"][0] >= 2
    (replay,) = page["replays"]
    assert float(replay["etaS"]) > 0

    # The lag follows the positions: partition 0 catches up.
    monitored["batches"].record(RECORDS_PER_PARTITION - (LIVE_START[0] + 4 * STEP))
    registry.set_positions(live, {f"{topic}/0": RECORDS_PER_PARTITION})

    def caught_up() -> dict[str, Any]:
        page = _read(browser)
        rows = {p["partition"]: p for p in _card(page, PROCESSOR)["partitions"]}
        assert rows[0]["lagRecords"] == "0"
        return page

    page = assert_eventually(caught_up, timeout=REFRESH_TIMEOUT_S, message="lag after a move")
    _assert_matches_api(page, served, key)

    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(tmp_path / "dashboard.png"))
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000  # a page, not a blank
    if os.environ.get("REFOLD_UPDATE_SCREENSHOT"):  # docs/serving.md's image, refreshed on demand
        shutil.copyfile(tmp_path / "dashboard.png", SCREENSHOT)
    assert SCREENSHOT.stat().st_size > 10_000


def test_dashboard_without_a_key_says_how_to_get_one(served: Served, browser: Any) -> None:
    browser.get(f"{served.base_url}/dashboard")
    page = assert_eventually(lambda: _refused(browser, 401), timeout=REFRESH_TIMEOUT_S)
    assert "/dashboard#key=" in page["auth"]
    assert "refold keys add --scope query" in page["auth"]

    # A key without the query scope: 403, same guidance.
    ingest_only = _api_key(served, "ingest")
    browser.get(f"{served.base_url}/dashboard#key={ingest_only}")
    page = assert_eventually(lambda: _refused(browser, 403), timeout=REFRESH_TIMEOUT_S)
    assert "query scope" in page["auth"]


def test_dashboard_page_is_static_and_self_contained(served: Served) -> None:
    page = httpx.get(f"{served.base_url}/dashboard", timeout=30)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp
    assert "connect-src 'self'" in csp
    # No CDN: every script and style sheet it loads is its own.
    assert "http://" not in page.text
    assert "https://" not in page.text
    for asset, media in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css")):
        response = httpx.get(f"{served.base_url}/dashboard/static/{asset}", timeout=30)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith(media)
        assert f"/dashboard/static/{asset}" in page.text
    # Only the page's own files: not the package's other files beside them.
    missing = httpx.get(f"{served.base_url}/dashboard/static/routes.py", timeout=30)
    assert missing.status_code == 404
