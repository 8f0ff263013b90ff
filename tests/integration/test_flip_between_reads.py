"""A replay's flip landing between a rebuild's reads of the registry (real Redis).

A generation being rebuilt asks, at every batch and every window-closing round, whether it is
still ``building`` and which generation is live: a building one holds back what the live one
sent already (side effects, dead letters, window results). The flip changes both keys in one
transaction, so the two must be read in one too. Read one after the other, a flip in between
paired ``building`` with an alias naming the rebuild itself. A rebuild's batch then took
itself for one with no live generation and held back all its side effects, and its closer
emitted again six windows the replaced generation had emitted (``test_windows``, once in a
full run). The client here flips right after the first read of the registry the code makes,
the most unlucky moment there is.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.client import Pipeline

from refold.contracts.layout import StateLayout
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry, status_and_live
from refold.processors.fold.windows import WindowFold
from refold.processors.runtime.dead_letter_index import building_against
from refold.processors.runtime.window_store import WindowCloser
from refold.processors.sales_windows.projection import SalesWindows

PROCESSOR = "sales_windows"
LATENESS_MS = 5_000


class _FlipAfterRead(Pipeline):
    """A pipeline that flips to the rebuild right after a transaction that read the registry."""

    flip: Any = None  # set on the class made per test

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        reads_registry = any(
            self.flip.layout.generations in args for args, _options in self.command_stack
        )
        result = super().execute(raise_on_error)
        if reads_registry:
            self.flip.read_in_transaction.append(self.transaction)
            self.flip()
        return result


class _FlipAfterReadClient(redis.Redis):
    """Flips to the rebuild right after the first command that reads the registry's status."""

    flip: Any = None

    def execute_command(self, *args: Any, **options: Any) -> Any:
        result = super().execute_command(*args, **options)
        if self.flip.layout.generations in args:
            self.flip()
        return result

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        pipeline_class = type("FlipPipeline", (_FlipAfterRead,), {"flip": self.flip})
        return pipeline_class(
            self.connection_pool, self.response_callbacks, transaction, shard_hint
        )


class _Flip:
    """Flips ``sales_windows`` to generation 2 once, through a client of its own."""

    def __init__(self, url: str, layout: StateLayout) -> None:
        self.layout = layout
        self.registry = GenerationRegistry(redis.Redis.from_url(url), layout)
        self.done = False
        self.read_in_transaction: list[bool] = []  # per pipeline that read the registry

    def __call__(self) -> None:
        if not self.done:
            self.done = True
            self.registry.flip(2)


def _two_generations(redis_url: str, prefix: str) -> tuple[_FlipAfterReadClient, _Flip]:
    """Generation 1 live (positions and a clock), 2 rebuilding it; a client that flips to 2."""
    layout = StateLayout(PROCESSOR, prefix)
    plain = redis.Redis.from_url(redis_url)
    registry = GenerationRegistry(plain, layout)
    assert registry.create({"topics": ["orders"]}, live=True) == 1
    assert registry.create({"topics": ["orders"], "replay_of": 1}) == 2
    registry.set_positions(1, {"orders/0": 40})
    plain.hset(registry.keys(1).clocks, "orders/0", 1_000_000)
    flip = _Flip(redis_url, layout)
    client_class = type("FlippingClient", (_FlipAfterReadClient,), {"flip": flip})
    client = client_class.from_url(redis_url)
    return client, flip


def test_status_and_live_reads_one_transaction_on_any_redis(redis_url, unique):
    # Run on a Redis Cluster too (test_redis_cluster): both keys are in the registry's slot.
    client = redis_client(redis_url)
    layout = StateLayout(PROCESSOR, f"test-{unique}")
    registry = GenerationRegistry(client, layout)
    assert status_and_live(client, layout, 1) == (None, None)
    assert registry.create({"topics": ["orders"]}, live=True) == 1
    assert registry.create({"topics": ["orders"], "replay_of": 1}) == 2
    assert status_and_live(client, layout, 2) == ("building", 1)
    registry.flip(2)
    assert status_and_live(client, layout, 2) == ("live", 2)
    assert status_and_live(client, layout, 1) == ("retired", 2)


def test_status_and_live_are_one_instant(redis_url, unique):
    client, flip = _two_generations(redis_url, f"test-{unique}")
    assert status_and_live(client, flip.layout, 2) == ("building", 1)
    assert flip.done  # the flip came right after that read
    assert flip.read_in_transaction == [True]  # one MULTI/EXEC, not a pipeline of two reads
    assert status_and_live(client, flip.layout, 2) == ("live", 2)


def test_a_rebuilds_batch_compares_with_the_live_generation_it_read(redis_url, unique):
    # Side effects and dead letters: what the live generation applied is held back, the rest
    # sent. Never "no live generation", which would hold back every side effect of the batch.
    client, flip = _two_generations(redis_url, f"test-{unique}")
    assert building_against(client, flip.layout, 2, {("orders", 0)}) == (1, {"orders/0": 40})
    assert flip.done
    assert building_against(client, flip.layout, 2, {("orders", 0)}) is None  # live now


def test_a_rebuilds_window_closer_holds_back_what_the_live_generation_closes(redis_url, unique):
    client, flip = _two_generations(redis_url, f"test-{unique}")
    fold: WindowFold = SalesWindows()
    closer = WindowCloser(flip.layout, 2, fold, LATENESS_MS, redis_url, {})
    closer._redis = client  # the flipping client, in place of the one it would make
    # Building (as read): windows up to the live generation's watermark, less what it holds.
    until, other = closer._suppression() or (None, None)
    assert flip.done
    assert until == 1_000_000 - LATENESS_MS
    assert other is not None
    assert other.generation == 1
    # Live after the flip: the same against the generation it replaced.
    until, replaced = closer._suppression() or (None, None)
    assert until == 1_000_000 - LATENESS_MS
    assert replaced is not None
    assert replaced.generation == 1
