"""The deploy gate: a generation refuses code it was not built by; `replay check` says so."""

import pytest

from refold.contracts.commerce import ORDERS
from refold.contracts.settings import KafkaSettings, RedisSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.processors.errors import ProcessorConfigError
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.code_identity import build_fingerprints
from refold.processors.runtime.runner import RunOptions, resolve_run
from refold.replay.__main__ import main as replay


@pytest.fixture
def live_generation(redis_url, kafka_bootstrap, unique, monkeypatch, tmp_path):
    prefix = f"gate-{unique}"
    monkeypatch.setenv("REFOLD_REDIS__URL", redis_url)
    monkeypatch.setenv("REFOLD_REDIS__KEY_PREFIX", prefix)
    monkeypatch.setenv("REFOLD_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    client = redis_client(redis_url)
    settings = (
        KafkaSettings(bootstrap_servers=kafka_bootstrap),
        RedisSettings(url=redis_url, key_prefix=prefix),
    )

    def run(**options):
        return resolve_run(
            OrderStateProjection(),
            [ORDERS],
            *settings,
            RunOptions(checkpoint_root=tmp_path, **options),
            client,
        )

    first = run()
    registry = GenerationRegistry.of(client, "order_state", prefix)
    return run, registry, first.generation


def test_same_code_resumes_and_the_gate_says_compatible(live_generation, capsys):
    run, registry, generation = live_generation
    assert (
        registry.meta(generation)["code_fingerprint"]
        == build_fingerprints(OrderStateProjection())["code_fingerprint"]
    )
    assert run().generation == generation
    assert replay(["check", "--processor", "order_state"]) == 0
    assert "compatible" in capsys.readouterr().out


def test_changed_fold_code_is_refused_until_rebuilt_or_accepted(live_generation, capsys):
    run, registry, generation = live_generation
    registry.update_meta(generation, {"code_fingerprint": "0123456789abcdef"})  # older code
    with pytest.raises(ProcessorConfigError, match=r"code fingerprint changed.*replay"):
        run()
    assert replay(["check", "--processor", "order_state"]) == 5
    out = capsys.readouterr().out
    assert "needs a rebuild" in out
    assert "replay --processor order_state --to-earliest --execute" in out
    assert run(accept_code_change=True).generation == generation
    assert replay(["check", "--processor", "order_state"]) == 0


def test_code_fingerprint_follows_the_source(tmp_path, monkeypatch):
    import importlib

    from refold.contracts.fingerprints import code_fingerprint

    monkeypatch.syspath_prepend(str(tmp_path))
    prints = []
    for body in ("return state", "return {**state, 'x': 1}"):
        (tmp_path / "fold_under_test.py").write_text(f"def apply(state):\n    {body}\n")
        import fold_under_test

        module = importlib.reload(fold_under_test)
        prints.append(code_fingerprint(module.apply, "layout-v1"))
    assert prints[0] != prints[1]
