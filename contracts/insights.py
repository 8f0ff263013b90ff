"""refold's insight contract: what a pattern processor's matches look like on their topic.

Registered like any user's contracts, through the ``refold.contracts`` entry point. One record,
``Insight``, for every pattern processor; its topic is ``<processor>.insights`` (declared by the
processor, created at its start), keyed by the pattern's key.
"""

from __future__ import annotations

from refold.contracts.catalog import SCHEMA_ROOT
from refold.contracts.registry import ContractSet

__all__ = ["INSIGHT", "INSIGHTS"]

INSIGHT = "Insight"

INSIGHTS = ContractSet(name="insights", schemas=SCHEMA_ROOT / "insights")
