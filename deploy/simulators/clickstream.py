"""A realistic, deterministic clickstream of a web shop, with its customer accounts.

Visitors arrive one after another (about ``sessions_per_second``, exponential gaps) and browse:
a landing page (home, a category or a product, from a search engine, a newsletter, social media
or directly), then a few actions (product and category pages, searches, the cart, the checkout,
their account); about a third of the sessions bounce after the landing page. A search is a
``SearchPerformed`` plus its results page; some searches get clicks with a position bias (the
first result is clicked most), each followed by a view of the product, and a visitor sometimes
goes back to an earlier search of the session and clicks there.

Visitors are browsers (``visitor_id``, the cookie): some come back for more sessions. A share of the
sessions is by signed-in customers, with ids in the commerce simulator's format
(:func:`~refold.deploy.simulators.orders.customer_id`; pass ``OrderSimulator(n).customer_ids`` to
use exactly the customers of an order stream). A customer's first session is preceded by its
``CustomerRegistered``; some visits to the account page change the profile (``ProfileChanged`` with
the changed fields only). Customers mostly use one browser, sometimes another one.

Event time (``occurred_at``) grows within a session with gaps of a second to a few minutes; a
share of the gaps (``long_gap_rate``) is a pause longer than :data:`SESSION_TIMEOUT_MS`, after
which the visitor continues under the same ``session_id``: a session window with that timeout
splits it in two.

**Order of the stream.** Events are yielded in event-time order over all keys, except that
about ``late_rate`` of the clickstream events are delivered late: yielded 5 s to 15 min (event
time) after they occurred, so after later events of their session, with an ``occurred_at``
older than what came before on their key. A late search can then come after its own clicks;
in event time a click always follows its search. Account events are never late: per customer,
the registration comes first and profile changes follow in event-time order.
"""

from __future__ import annotations

import heapq
import math
import random
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any
from urllib.parse import quote_plus

from refold.deploy.simulators.orders import SimulatedEvent, customer_id

__all__ = ["SESSION_TIMEOUT_MS", "ClickstreamSimulator"]

SESSION_TIMEOUT_MS = 30 * 60_000
"""Inactivity gap after which a session window closes (the usual web-analytics 30 minutes)."""

_BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z, as the order simulator
_SITE = "https://shop.example.com"
_SKUS = 2000  # SKU-0001..SKU-2000, the order simulator's catalogue
_CATEGORIES = ("shoes", "jackets", "bags", "shirts", "trousers", "accessories", "outdoor", "kids")
# (term, results); popularity falls with the rank (Zipf). Misspellings find nothing.
_QUERIES = (
    ("running shoes", 184),
    ("rain jacket", 67),
    ("backpack", 122),
    ("sneakers", 240),
    ("t-shirt", 412),
    ("jeans", 156),
    ("winter coat", 48),
    ("hiking boots", 39),
    ("sunglasses", 73),
    ("wool socks", 21),
    ("leather belt", 17),
    ("kids raincoat", 12),
    ("runnign shoes", 0),
    ("yoga pants", 33),
    ("duffel bag", 9),
    ("linen shirt", 26),
    ("beanie", 44),
    ("waterproof trousers", 8),
    ("jakcet", 0),
    ("gift card", 1),
)
_QUERY_CUM = tuple(accumulate(1 / (rank + 1) for rank in range(len(_QUERIES))))
_MAX_POSITION = 48  # results a visitor may scroll through (two pages of 24)
# Click probability falls with the rank as rank**-1.3: ~30% of the clicks on the first result.
_POSITION_CUM = tuple(accumulate(rank**-1.3 for rank in range(1, _MAX_POSITION + 1)))
_REFERRERS = (
    (None, 35),
    ("https://www.google.com/", 33),
    ("https://www.bing.com/", 4),
    ("https://newsletter.example.com/2026/weekly", 10),
    ("https://www.instagram.com/", 12),
    ("https://www.facebook.com/", 6),
)
_DEVICES = (("DESKTOP", 45), ("MOBILE", 48), ("TABLET", 7))
_FIRST_NAMES = ("Anna", "Ben", "Chloe", "Daan", "Emma", "Finn", "Grace", "Hugo", "Iris", "Jonas")
_LAST_NAMES = ("de Vries", "Muller", "Smith", "Jansen", "Martin", "Rossi", "Garcia", "Bakker")
_EMAIL_DOMAINS = ("example.com", "example.org", "example.net")
_COUNTRIES = (("NL", 30), ("DE", 25), ("GB", 12), ("FR", 10), ("BE", 8), ("US", 8), ("ES", 7))
_TIERS = ("STANDARD", "SILVER", "GOLD", "PLATINUM")
_TIER_WEIGHTS = (70, 18, 9, 3)
# Tunables of a session, each with its reason:
_BOUNCE_RATE = 0.3  # a third of web sessions are single-page visits
_MEAN_ACTIONS = 5.0  # actions after the landing page of a session that does not bounce
_MAX_ACTIONS = 40  # a cap, so one session does not run for hours
_MEDIAN_GAP_MS = 20_000  # time on a page: median 20 s, log-normal, clipped to [1 s, 10 min]
_RETURNING_RATE = 0.3  # anonymous sessions by a browser seen before (unique visitors < sessions)
_OTHER_DEVICE_RATE = 0.15  # signed-in sessions from a customer's other browser
_PROFILE_CHANGE_RATE = 0.35  # account-page visits that change the profile
_CHECKOUT_LEAD_MS = 60_000  # an account made at checkout: a minute before the first order


@dataclass(slots=True)
class _Customer:
    customer_id: str
    visitor_id: str  # the browser they use most
    email: str
    name: str
    country: str
    tier: str
    last_change_ms: int  # event time of its newest account event


@dataclass(slots=True)
class _Session:
    session_id: str
    visitor_id: str
    customer: _Customer | None
    device: str
    clock: int
    last_url: str | None = None
    searches: list[tuple[str, int, str]] = field(default_factory=list)  # (id, query, url)


class ClickstreamSimulator:
    """Generates ``(event_type, event)`` pairs; the same arguments give the same stream.

    Each iteration starts over, so iterating the same simulator twice yields the same events.
    Clickstream events belong on ``web.pageviews`` / ``web.searches`` (key ``session_id``),
    account events on ``crm.customers`` (key ``customer_id``); see :mod:`refold.contracts.web`.

    Args:
        sessions: Number of browsing sessions.
        seed: Random seed.
        customer_ids: The customers who sign in; default ``cus-000001`` up to one per four
            sessions. ``OrderSimulator(n).customer_ids`` makes web and order events share them.
        customer_share: Share of the sessions by a signed-in customer (0 with no customer ids).
        late_rate: Share of the clickstream events delivered late (see the module's docstring).
        long_gap_rate: Share of the gaps within a session longer than :data:`SESSION_TIMEOUT_MS`.
        sessions_per_second: Mean arrival rate of sessions, in event time; with sessions of a
            few minutes the default keeps a few hundred sessions open at once.
        start_ms: Event time of the first arrival (epoch milliseconds).
        session_prefix: Prefix of the session ids (``ses-00000001``...); two simulators writing
            to the same topics need different prefixes, as do their ``visitor_prefix``.
        visitor_prefix: Prefix of the visitor ids (``vis-0000001``...).
        registered_by: Customers that must have an account by an event time, e.g. each
            customer's first order (:func:`~refold.deploy.simulators.orders.first_orders`):
            one that has not registered in a session by then registers a minute before it
            (an account made at checkout, without a visit in this stream).
    """

    def __init__(
        self,
        sessions: int,
        seed: int = 7,
        *,
        customer_ids: Sequence[str] | None = None,
        customer_share: float = 0.35,
        late_rate: float = 0.01,
        long_gap_rate: float = 0.01,
        sessions_per_second: float = 1.0,
        start_ms: int = _BASE_MS,
        session_prefix: str = "ses-",
        visitor_prefix: str = "vis-",
        registered_by: Mapping[str, int] | None = None,
    ) -> None:
        self.sessions = sessions
        self.seed = seed
        self.customer_ids = (
            tuple(customer_ids)
            if customer_ids is not None
            else tuple(customer_id(n) for n in range(1, max(1, sessions // 4) + 1))
        )
        self.customer_share = customer_share
        self.late_rate = late_rate
        self.long_gap_rate = long_gap_rate
        self.sessions_per_second = sessions_per_second
        self.start_ms = start_ms
        self.session_prefix = session_prefix
        self.visitor_prefix = visitor_prefix
        self.registered_by = dict(registered_by or {})

    def __iter__(self) -> Iterator[SimulatedEvent]:
        return _Run(self).events()


class _Run:
    """One pass over the stream: the random generator and everything it has made so far."""

    def __init__(self, config: ClickstreamSimulator) -> None:
        self.config = config
        self.rng = random.Random(config.seed)  # noqa: S311 - test data, not security
        # (emit time, sequence, event type, event): sequence keeps ties in creation order.
        self.pending: list[tuple[int, int, str, dict[str, Any]]] = []
        self.sequence = 0
        self.customers: dict[str, _Customer] = {}
        self.anonymous_visitors: list[str] = []
        self.visitors = 0

    def events(self) -> Iterator[SimulatedEvent]:
        config = self.config
        arrival = config.start_ms
        mean_arrival_gap_ms = 1000.0 / config.sessions_per_second
        # (registration time, customer): the accounts made at checkout, in time order.
        checkouts = sorted((at - _CHECKOUT_LEAD_MS, c) for c, at in config.registered_by.items())
        checkouts.reverse()  # popped from the end
        started = 0
        while started < config.sessions or self.pending or checkouts:
            arriving = started < config.sessions
            now = min(
                arrival if arriving else math.inf,
                self.pending[0][0] if self.pending else math.inf,
            )
            while checkouts and checkouts[-1][0] <= now:  # before anything later is emitted
                at, cid = checkouts.pop()
                if cid not in self.customers:
                    self._sign_in(cid, at)
            if arriving and (not self.pending or arrival <= self.pending[0][0]):
                started += 1
                self._session(started, arrival)
                arrival += max(1, round(self.rng.expovariate(1 / mean_arrival_gap_ms)))
            elif self.pending:
                _, _, event_type, event = heapq.heappop(self.pending)
                yield event_type, event

    # -- building blocks ------------------------------------------------------------------

    def _id(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def _weighted(self, choices: Sequence[tuple[Any, int]]) -> Any:
        return self.rng.choices([c for c, _ in choices], [w for _, w in choices])[0]

    def _new_visitor(self) -> str:
        self.visitors += 1
        return f"{self.config.visitor_prefix}{self.visitors:07d}"

    def _push(self, at_ms: int, event_type: str, event: dict[str, Any]) -> None:
        self.sequence += 1
        heapq.heappush(self.pending, (at_ms, self.sequence, event_type, event))

    def _gap(self) -> int:
        rng = self.rng
        if rng.random() < self.config.long_gap_rate:
            return rng.randint(SESSION_TIMEOUT_MS + 60_000, 3 * SESSION_TIMEOUT_MS)
        gap = rng.lognormvariate(math.log(_MEDIAN_GAP_MS), 1.0)
        return min(600_000, max(1_000, round(gap)))

    def _emit(self, session: _Session, event_type: str, fields: dict[str, Any]) -> None:
        """Schedule a clickstream event at the session's clock, late now and then."""
        customer = session.customer
        event = {
            "event_id": self._id(),
            "session_id": session.session_id,
            "visitor_id": session.visitor_id,
            "customer_id": None if customer is None else customer.customer_id,
            **fields,
            "occurred_at": session.clock,
        }
        delivered = session.clock
        if self.rng.random() < self.config.late_rate:
            delivered += round(math.exp(self.rng.uniform(math.log(5_000), math.log(900_000))))
        self._push(delivered, event_type, event)

    def _view(
        self,
        session: _Session,
        page_type: str,
        path: str,
        *,
        sku: str | None = None,
        referrer: str | None = None,
        external: bool = False,
    ) -> str:
        url = _SITE + path
        self._emit(
            session,
            "PageViewed",
            {
                "url": url,
                "path": path.split("?", 1)[0],
                "page_type": page_type,
                "sku": sku,
                # a landing page's referrer is external (None: direct); else the last page
                "referrer": referrer if external or referrer is not None else session.last_url,
                "device": session.device,
            },
        )
        session.last_url = url
        return url

    def _sku(self) -> str:
        return f"SKU-{self.rng.randint(1, _SKUS):04d}"

    # -- a session --------------------------------------------------------------------------

    def _session(self, number: int, start: int) -> None:
        rng = self.rng
        config = self.config
        customer = None
        registered = False
        clock = start
        if config.customer_ids and rng.random() < config.customer_share:
            customer, registered = self._sign_in(rng.choice(config.customer_ids), start)
            if registered:  # registered just now: the visit follows, in the same browser
                clock = start + rng.randint(1_000, 20_000)
        if customer is None:
            if self.anonymous_visitors and rng.random() < _RETURNING_RATE:
                visitor = rng.choice(self.anonymous_visitors)
            else:
                visitor = self._new_visitor()
                self.anonymous_visitors.append(visitor)
        elif not registered and rng.random() < _OTHER_DEVICE_RATE:
            visitor = self._new_visitor()
        else:
            visitor = customer.visitor_id
        session = _Session(
            session_id=f"{config.session_prefix}{number:08d}",
            visitor_id=visitor,
            customer=customer,
            device=self._weighted(_DEVICES),
            clock=clock,
        )
        self._landing(session)
        if rng.random() < _BOUNCE_RATE:
            return
        actions = min(_MAX_ACTIONS, 1 + int(rng.expovariate(1 / (_MEAN_ACTIONS - 1))))
        for _ in range(actions):
            session.clock += self._gap()
            roll = rng.random()
            if roll < 0.45:
                self._browse(session)
            elif roll < 0.75:
                self._search(session)
            elif roll < 0.87:
                self._view(session, "CART", "/cart")
            elif roll < 0.93:
                self._view(session, "CHECKOUT", "/checkout")
            else:
                self._account(session)

    def _landing(self, session: _Session) -> None:
        referrer = self._weighted(_REFERRERS)
        roll = self.rng.random()
        if roll < 0.4:
            self._view(session, "HOME", "/", referrer=referrer, external=True)
        elif roll < 0.65:
            path = f"/c/{self.rng.choice(_CATEGORIES)}"
            self._view(session, "CATEGORY", path, referrer=referrer, external=True)
        else:
            sku = self._sku()
            self._view(session, "PRODUCT", f"/p/{sku}", sku=sku, referrer=referrer, external=True)

    def _browse(self, session: _Session) -> None:
        if self.rng.random() < 0.35:
            self._view(session, "CATEGORY", f"/c/{self.rng.choice(_CATEGORIES)}")
        else:
            sku = self._sku()
            self._view(session, "PRODUCT", f"/p/{sku}", sku=sku)

    def _search(self, session: _Session) -> None:
        rng = self.rng
        query = rng.choices(range(len(_QUERIES)), cum_weights=_QUERY_CUM)[0]
        term, results = _QUERIES[query]
        search_id = self._id()
        self._emit(
            session,
            "SearchPerformed",
            {"search_id": search_id, "query": term, "results_count": results},
        )
        session.clock += rng.randint(150, 1_200)  # the results page renders
        url = self._view(session, "SEARCH", f"/search?q={quote_plus(term)}")
        if results > 0:
            session.searches.append((search_id, query, url))
        clicks = rng.choices((0, 1, 2, 3), (40, 45, 12, 3))[0] if results > 0 else 0
        for _ in range(clicks):
            self._click(session, session.searches[-1])
        if session.searches and rng.random() < 0.1:
            # back to an earlier result list of this session (the back button)
            session.clock += self._gap()
            self._click(session, rng.choice(session.searches))

    def _click(self, session: _Session, search: tuple[str, int, str]) -> None:
        rng = self.rng
        search_id, query, search_url = search
        results = _QUERIES[query][1]
        shown = min(results, _MAX_POSITION)
        position = rng.choices(range(1, shown + 1), cum_weights=_POSITION_CUM[:shown])[0]
        sku = _result_sku(query, position)
        url = f"{_SITE}/p/{sku}"
        session.clock += rng.randint(2_000, 60_000)
        self._emit(
            session,
            "SearchResultClicked",
            {"search_id": search_id, "position": position, "sku": sku, "url": url},
        )
        session.clock += rng.randint(200, 1_500)  # the product page loads
        self._view(session, "PRODUCT", f"/p/{sku}", sku=sku, referrer=search_url)

    def _account(self, session: _Session) -> None:
        self._view(session, "ACCOUNT", "/account")
        customer = session.customer
        if customer is None or self.rng.random() >= _PROFILE_CHANGE_RATE:
            return
        changed_at = session.clock + self.rng.randint(5_000, 90_000)
        if changed_at <= customer.last_change_ms:
            return  # another session of this customer changed it later: keep per-key order
        session.clock = changed_at
        self._change_profile(customer, changed_at)

    # -- accounts ---------------------------------------------------------------------------

    def _sign_in(self, cid: str, start: int) -> tuple[_Customer, bool]:
        """The customer, and whether it registered now (at ``start``): its first session."""
        customer = self.customers.get(cid)
        if customer is not None:
            return customer, False
        rng = self.rng
        name = f"{rng.choice(_FIRST_NAMES)} {rng.choice(_LAST_NAMES)}"
        if self.anonymous_visitors and rng.random() < 0.5:
            visitor = rng.choice(self.anonymous_visitors)  # browsed anonymously before
        else:
            visitor = self._new_visitor()
        customer = _Customer(
            customer_id=cid,
            visitor_id=visitor,
            email=self._email(name),
            name=name,
            country=self._weighted(_COUNTRIES),
            tier=rng.choices(_TIERS, _TIER_WEIGHTS)[0],
            last_change_ms=start,
        )
        self.customers[cid] = customer
        self._push(
            start,
            "CustomerRegistered",
            {
                "event_id": self._id(),
                "customer_id": customer.customer_id,
                "email": customer.email,
                "name": customer.name,
                "country": customer.country,
                "tier": customer.tier,
                "visitor_id": visitor,
                "registered_at": start,
            },
        )
        return customer, True

    def _email(self, name: str) -> str:
        local = name.lower().replace(" ", ".")
        return f"{local}{self.rng.randint(1, 99)}@{self.rng.choice(_EMAIL_DOMAINS)}"

    def _change_profile(self, customer: _Customer, changed_at: int) -> None:
        rng = self.rng
        changes: dict[str, str | None] = dict.fromkeys(("email", "name", "country", "tier"))
        for what in rng.sample(("email", "email", "country", "tier", "tier", "name"), 2):
            if what == "email":
                changes["email"] = customer.email = self._email(customer.name)
            elif what == "country":
                others = [c for c, _ in _COUNTRIES if c != customer.country]
                changes["country"] = customer.country = rng.choice(others)
            elif what == "tier":
                rank = _TIERS.index(customer.tier)
                step = -1 if rank == len(_TIERS) - 1 or (rank > 0 and rng.random() < 0.2) else 1
                changes["tier"] = customer.tier = _TIERS[rank + step]
            else:
                first = customer.name.split(" ", 1)[0]
                last = rng.choice([n for n in _LAST_NAMES if not customer.name.endswith(n)])
                changes["name"] = customer.name = f"{first} {last}"
        customer.last_change_ms = changed_at
        self._push(
            changed_at,
            "ProfileChanged",
            {
                "event_id": self._id(),
                "customer_id": customer.customer_id,
                **changes,
                "changed_at": changed_at,
            },
        )


def _result_sku(query: int, position: int) -> str:
    """The product at ``position`` of ``query``'s results: fixed, so clicks are consistent."""
    return f"SKU-{(query * 7919 + position * 104_729) % _SKUS + 1:04d}"
