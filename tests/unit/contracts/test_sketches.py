"""The pure parts of counting the union of sketches spread over slots (no Redis)."""

from refold.contracts.store.sketches import UnionCounts, merge_arguments


class _Pipe:
    """Records the commands queued (a pipeline of a single Redis, as the tests need)."""

    def __init__(self) -> None:
        self.queued: list[tuple] = []

    def execute_command(self, *args):
        self.queued.append(args)


def test_the_script_gets_each_groups_existing_sketches_after_their_number():
    groups = [[b"h1", None, b"h2"], [], [None], [b"h3"]]
    assert merge_arguments(groups) == [2, b"h1", b"h2", 0, 0, 1, b"h3"]


def test_on_one_server_each_nonempty_group_is_one_pfcount_in_the_callers_pipeline():
    union = UnionCounts(object(), [["a", "b"], [], ["c"]], "p:{x}:scratch:pf")  # type: ignore[arg-type]
    assert not union.spread
    pipe = _Pipe()
    assert union.queue(pipe) == 2
    assert pipe.queued == [("PFCOUNT", "a", "b"), ("PFCOUNT", "c")]
    assert union.counts([7, 3]) == [7, 0, 3]
