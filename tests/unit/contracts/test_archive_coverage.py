"""The archive's coverage ledger: ranges merged, cut back with the files, gaps found."""

from __future__ import annotations

from refold.contracts.archive_coverage import ArchiveLedger, CoveredRanges


def test_ranges_merge_when_they_touch_or_overlap_and_are_cut_back_at_a_position():
    covered = CoveredRanges().add(10, 20).add(0, 5).add(5, 10).add(30, 40).add(35, 50)
    assert covered.ranges == ((0, 20), (30, 50))
    assert covered.add(7, 7) == covered  # an empty range covers nothing
    assert covered.cut(35).ranges == ((0, 20), (30, 35))
    assert covered.cut(30).ranges == ((0, 20),)
    assert covered.describe() == "0-20, 30-50"
    assert CoveredRanges().describe() == "none"


def test_gaps_are_the_parts_of_a_span_no_range_covers():
    covered = CoveredRanges(((0, 20), (30, 50)))
    assert covered.gaps(0, 20) == []
    assert covered.gaps(5, 45) == [(20, 30)]
    assert covered.gaps(15, 60) == [(20, 30), (50, 60)]
    assert CoveredRanges().gaps(3, 9) == [(3, 9)]
    assert covered.gaps(60, 70) == [(60, 70)]


def test_the_ledger_is_kept_per_partition_beside_the_archive(tmp_path):
    ledger = ArchiveLedger(tmp_path, fsync=False)
    assert not ledger.is_archive()
    assert ledger.read("orders", 0) == CoveredRanges()
    ledger.update("orders", 0, lambda c: c.add(0, 100))
    ledger.update("orders", 0, lambda c: c.add(100, 250))
    ledger.update("orders", 1, lambda c: c.add(0, 7))
    assert ledger.read("orders", 0).ranges == ((0, 250),)
    assert ledger.update("orders", 0, lambda c: c.cut(120)).ranges == ((0, 120),)
    assert ArchiveLedger(tmp_path).read("orders", 1).ranges == ((0, 7),)
