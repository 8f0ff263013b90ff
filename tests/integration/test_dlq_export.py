"""`refold dlq export`: every dead letter a generation decided, one JSON line each."""

from __future__ import annotations

import json

from refold.contracts.layout import StateLayout
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.deploy.cli import main as refold


def test_export_writes_every_letter_of_the_generation_not_a_sample(
    redis_url, unique, monkeypatch, tmp_path, capsys
):
    prefix = f"test-{unique}"
    client = redis_client(redis_url)
    registry = GenerationRegistry(client, StateLayout("order_state", prefix))
    generation = registry.create({"topics": ["orders"]}, live=True)
    index = registry.keys(generation).dead_letters
    letters = {f"orders:0:{i}": "late" if i % 3 else "rejected" for i in range(1_200)}
    client.hset(index, mapping=letters)
    monkeypatch.setenv("REFOLD_REDIS__URL", redis_url)
    monkeypatch.setenv("REFOLD_REDIS__KEY_PREFIX", prefix)
    out = tmp_path / "letters.jsonl"
    assert refold(["dlq", "export", "--processor", "order_state", "--out", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert {line["origin"]: line["reason"] for line in lines} == letters
    assert {line["generation"] for line in lines} == {generation}
    assert "1200 dead letter(s)" in capsys.readouterr().err
    # to stdout, of a generation named
    args = ["dlq", "export", "--processor", "order_state", "--generation", str(generation)]
    assert refold(args) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1_200
    assert refold([*args[:-1], "99"]) == 1
    client.close()
