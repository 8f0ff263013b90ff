"""Checkpoint locations (paths and URLs) and the local file operations refold does on them."""

import re
from pathlib import Path

import pytest

from refold.contracts.layout import DEFAULT_KEY_PREFIX
from refold.contracts.settings import SparkSettings
from refold.processors.errors import ProcessorConfigError
from refold.processors.runtime.checkpoints import (
    checkpoint_location,
    checkpoint_root,
    has_batches,
    is_local,
    prefix_folder,
    remove_generation_checkpoints,
    remove_stale_checkpoint,
)


@pytest.mark.parametrize(
    ("url", "root"),
    [
        (None, "state/checkpoints"),
        ("/mnt/refold/checkpoints", "/mnt/refold/checkpoints"),
        ("file:///mnt/refold", "/mnt/refold"),
        ("hdfs://namenode:8020/refold/", "hdfs://namenode:8020/refold"),
        ("s3a://bucket/refold", "s3a://bucket/refold"),
    ],
)
def test_the_root_is_the_setting_or_the_state_dir(url: str | None, root: str) -> None:
    settings = SparkSettings(checkpoint_url=url)
    assert checkpoint_root(Path("state"), settings, key_prefix=DEFAULT_KEY_PREFIX) == root
    # Another deployment (key prefix) has its own folder below it.
    assert checkpoint_root(Path("state"), settings, key_prefix="staging") == f"{root}/staging"


@pytest.mark.parametrize("url", ["hdfs://", "h dfs://x/y"])
def test_a_url_hadoop_cannot_name_is_refused(url: str) -> None:
    with pytest.raises(ProcessorConfigError, match="CHECKPOINT_URL"):
        checkpoint_root(Path("state"), SparkSettings(checkpoint_url=url), key_prefix="refold")


def test_a_prefix_is_one_folder_name_that_never_collides() -> None:
    assert prefix_folder("test-1a2b.c_d") == "test-1a2b.c_d"
    odd = [prefix_folder(p) for p in ("a:b", "a/b", "a b", "..", "a_b")]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", f) and f not in (".", "..") for f in odd)
    assert len(set(odd)) == len(odd)  # "a:b" and "a/b" do not both become "a_b"


def test_locations_of_generations_and_their_resets() -> None:
    assert checkpoint_location("hdfs://nn:8020/c", "orders", 3) == "hdfs://nn:8020/c/orders/g3"
    assert checkpoint_location("/c", "orders", 3, epoch=2) == "/c/orders/g3-reset2"
    assert is_local("/c")
    assert is_local("file:///c")
    assert not is_local("hdfs://nn/c")


def test_batches_stale_checkpoints_and_gc_on_a_local_root(tmp_path: Path) -> None:
    root = str(tmp_path)
    for name in ("g1", "g1-reset1", "g10", "g2"):
        (tmp_path / "orders" / name / "offsets").mkdir(parents=True)
    (tmp_path / "orders" / "g2" / "offsets" / "0").write_text("v1")
    assert has_batches(f"{root}/orders/g2")
    assert not has_batches(f"{root}/orders/g1")
    assert not has_batches(f"{root}/orders/g9")  # never ran
    # gc removes g1 and its resets, not g10 whose name only starts the same.
    assert remove_generation_checkpoints(root, "orders", 1) == 2
    assert sorted(p.name for p in (tmp_path / "orders").iterdir()) == ["g10", "g2"]
    assert remove_generation_checkpoints(root, "customers", 1) == 0
    remove_stale_checkpoint(f"file://{root}/orders/g2")
    assert not (tmp_path / "orders" / "g2").exists()
