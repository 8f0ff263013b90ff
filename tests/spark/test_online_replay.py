"""Kappa cutover under live traffic: a shadow generation is rebuilt while the live processor keeps
folding new events, readers keep reading, and the live processor follows the alias afterwards."""

from __future__ import annotations

import threading
import time

from refold.contracts.registry import processor_spec
from refold.contracts.store.generations import GenerationRegistry
from refold.deploy.demo import wait_until_caught_up
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import fold_all
from refold.processors.order_state.projection import OrderStateProjection
from refold.replay.plan import ToEarliest
from refold.replay.rebuild import plan_replay, run_rebuild

from .conftest import oracle

WATCHED = ("ord-0000007", "late-0000003")  # one settled order, one that changes during the replay


def _expected(key_events, key, positions):
    """The oracle state of ``key`` folded from its events (with tokens) below ``positions``."""
    wanted = [
        event
        for event, token in key_events
        if token.offset < positions.get((token.topic, token.partition), 0)
    ]
    return fold_all(OrderStateProjection(), wanted).states.get(key)


def test_shadow_rebuild_under_live_traffic_cuts_over_and_the_live_processor_follows(
    world, monkeypatch
):
    publisher = world.publisher()
    first = list(OrderSimulator(800, seed=21))
    produced = list(zip(first, publisher.emit_many(first), strict=True))
    registry = GenerationRegistry.of(world.client, "order_state", world.redis.key_prefix)
    reader = world.reader()
    live_process = world.processor(name="live").start()
    late = list(OrderSimulator(1000, seed=22, order_prefix="late-"))
    samples = []
    stop_reading = threading.Event()
    rebuilt = threading.Event()
    threads: list[threading.Thread] = []
    offsets = world.offsets()
    try:
        wait_until_caught_up(reader, offsets, [world.topic.name], alive=live_process.alive)
        g1 = reader.live_generation()

        def produce() -> None:  # ~500 events/s during the rebuild and a little after the flip
            after_flip = 0
            for start in range(0, len(late), 100):
                if stop_reading.is_set():
                    return
                chunk = late[start : start + 100]
                produced.extend(zip(chunk, publisher.emit_many(chunk), strict=True))
                time.sleep(0.2)
                after_flip += rebuilt.is_set()
                if after_flip > 10:
                    return

        def read() -> None:
            while not stop_reading.is_set():
                for key in WATCHED:
                    samples.append((key, reader.get("orders", key)))
                time.sleep(0.005)

        producer = threading.Thread(target=produce)
        reader_loop = threading.Thread(target=read)
        threads.extend((producer, reader_loop))
        producer.start()
        reader_loop.start()
        for key, value in world.env.items():  # the deployment's environment
            monkeypatch.setenv(key, value)
        spec = processor_spec("order_state")
        plan = plan_replay(spec, ToEarliest(), world.kafka, world.client, world.redis.key_prefix)
        assert plan.ready, plan.render()
        before = len(produced)
        result = run_rebuild(plan, spec, world.kafka, world.redis, state_dir=world.state_dir)
        rebuilt.set()
        assert len(produced) > before  # events kept arriving while the shadow was built
        producer.join()
        assert result.previous == g1
        assert reader.live_generation() == result.generation

        # The live processor notices the retirement and takes the new generation over.
        deadline = time.monotonic() + 180
        while f":{live_process.pid}:" not in (registry.lease_owner(result.generation) or ""):
            assert time.monotonic() < deadline, live_process.log_tail()
            assert live_process.alive(), live_process.log_tail()
            time.sleep(0.2)
        wait_until_caught_up(reader, offsets, [world.topic.name], alive=live_process.alive)
    finally:
        offsets.close()
        stop_reading.set()
        live_process.stop()
        for thread in threads:
            thread.join()

    events = [event for event, _token in produced]
    expected = oracle(events)
    states, totals = world.state(result.generation)
    assert states == expected.states
    assert totals == dict(expected.aggregate)
    assert registry.status(g1) == "retired"

    # Every read was a whole generation: the state matches the positions it was read with.
    # (Each of the thousands of samples folds only its own key's events.)
    assert samples
    by_key = {key: [(e, t) for e, t in produced if e[1]["order_id"] == key] for key in WATCHED}
    for key, view in samples:
        assert view.value == _expected(by_key[key], key, view.positions), (key, view.generation)
    generations = [view.generation for _key, view in samples]
    assert generations == sorted(generations)  # old, then new: never back
    assert set(generations) == {g1, result.generation}
