"""The customer_profiles fold: a versioned table of profiles (pure).

The state of a customer is ``{"customer_id", "versions": [[valid_from, profile], ...]}``, in
valid-from order: a registration makes the first version, each change a new one with the
changed fields. Readers take the version valid at a time with
:func:`refold.processors.fold.lookups.version_at`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refold.contracts.processors import ProcessorOptions
from refold.processors.fold.eventtime import event_time_ms
from refold.processors.fold.projection import EventRejectedError, State

__all__ = ["PROFILE_FIELDS", "CustomerProfilesProjection", "build"]

PROFILE_FIELDS = ("email", "name", "country", "tier")


class CustomerProfilesProjection:
    """Profile versions per customer (table ``profiles``)."""

    name = "customer_profiles"
    table = "profiles"
    aggregate = "profile_totals"
    event_types = ("CustomerRegistered", "ProfileChanged")

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
            return {"customer_id": str(event["customer_id"]), "versions": [[at, profile]]}
        if state is None:
            msg = f"profile change for unregistered customer {event['customer_id']}"
            raise EventRejectedError(msg)
        at = event_time_ms(event, "changed_at")
        versions = state["versions"]
        if at < versions[-1][0]:
            msg = f"profile change at {at} is older than the customer's last version"
            raise EventRejectedError(msg)
        changed = {f: event[f] for f in PROFILE_FIELDS if event.get(f) is not None}
        return {**state, "versions": [*versions, [at, {**versions[-1][1], **changed}]]}

    def contribution(self, state: State) -> Mapping[str, int]:
        """Customers and profile versions."""
        return {"customers": 1, "versions": len(state["versions"])}


def build(options: ProcessorOptions) -> CustomerProfilesProjection:
    """The projection (the spec's ``projection`` factory); it has no options of its own."""
    del options
    return CustomerProfilesProjection()
