"""The customer_profiles fold: a versioned table of profiles (pure).

The state of a customer is ``{"customer_id", "versions": [[valid_from, profile], ...]}``, in
valid-from order: a registration makes the first version, each change a new one with the
changed fields. The versions are bounded by a
:class:`~refold.processors.fold.lookups.VersionRetention` (the processor's options), applied
here by :func:`~refold.processors.fold.lookups.add_version`; ``"dropped"`` counts the versions
it dropped. Readers take the version valid at a time with
:func:`refold.processors.fold.lookups.as_of`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refold.contracts.processors import ProcessorOptions
from refold.processors.fold.eventtime import event_time_ms
from refold.processors.fold.lookups import VersionRetention, add_version
from refold.processors.fold.projection import EventRejectedError, State

__all__ = ["DEFAULT_RETENTION", "PROFILE_FIELDS", "CustomerProfilesProjection", "build"]

PROFILE_FIELDS = ("email", "name", "country", "tier")
# The newest 32 versions, and none superseded more than 90 days before the newest.
DEFAULT_RETENTION = VersionRetention(max_versions=32, horizon_ms=90 * 24 * 3_600_000)


class CustomerProfilesProjection:
    """Profile versions per customer (table ``profiles``)."""

    name = "customer_profiles"
    table = "profiles"
    aggregate = "profile_totals"
    event_types = ("CustomerRegistered", "ProfileChanged")

    def __init__(self, retention: VersionRetention | None = None) -> None:
        self.retention = retention or DEFAULT_RETENTION

    def key(self, event_type: str, event: Mapping[str, Any]) -> str:
        """Profiles are per customer."""
        del event_type
        return str(event["customer_id"])

    def apply(self, state: State | None, event_type: str, event: Mapping[str, Any]) -> State:
        """Add the version the event makes."""
        if event_type == "CustomerRegistered":
            if state is not None:
                msg = f"customer {event['customer_id']} is registered already"
                raise EventRejectedError(msg)
            profile = {f: event[f] for f in PROFILE_FIELDS}
            at = event_time_ms(event, "registered_at")
            row = {"customer_id": str(event["customer_id"])}
            return add_version(row, at, profile, self.retention)
        if state is None:
            msg = f"profile change for unregistered customer {event['customer_id']}"
            raise EventRejectedError(msg)
        at = event_time_ms(event, "changed_at")
        versions = state["versions"]
        if at < versions[-1][0]:
            msg = f"profile change at {at} is older than the customer's last version"
            raise EventRejectedError(msg)
        changed = {f: event[f] for f in PROFILE_FIELDS if event.get(f) is not None}
        return add_version(state, at, {**versions[-1][1], **changed}, self.retention)

    def contribution(self, state: State) -> Mapping[str, int]:
        """Customers, the profile versions kept, and those retention dropped."""
        return {
            "customers": 1,
            "versions": len(state["versions"]),
            "dropped_versions": int(state.get("dropped", 0)),
        }


def build(options: ProcessorOptions) -> CustomerProfilesProjection:
    """The projection (the spec's ``projection`` factory), with the options' retention."""
    return CustomerProfilesProjection(
        VersionRetention(
            max_versions=getattr(options, "max_versions", DEFAULT_RETENTION.max_versions),
            horizon_ms=getattr(options, "version_horizon_ms", DEFAULT_RETENTION.horizon_ms),
        )
    )
