"""The names of the marts the API reads: the one place that spells its schema and tables."""

from __future__ import annotations

from mallard.warehouse import LAKE

SCHEMA = "marts"  # dbt's schema of the tables and views the API and analysts read
EVENTS = "events"
# The table behind the `customers` view that the index reads: each customer's row without the
# firstEvent/lastEvent members of its metadata (read through the view, by customer id).
PROFILES = "customer_profiles"
CUSTOMERS = "customers"
CUSTOMER_IDENTIFIERS = "customer_identifiers"
CUSTOMER_PREFERENCES = "customer_preferences"
FRESHNESS = "freshness"
# Each trait's value per period of event time, per profile as it stood: the asOf answers.
TRAIT_HISTORY = "trait_history"
# Audiences as code (docs/audiences.md): one row per audience file, and the membership history.
AUDIENCES = "audiences"
AUDIENCE_MEMBERS = "audience_members"
# The marts the index and the freshness headers answer from; a snapshot that changed none of them
# answers as the one before.
SERVED = (PROFILES, EVENTS, FRESHNESS)


def at(table: str, version: int) -> str:
    """A FROM item: the mart as of a snapshot."""
    return f"{LAKE}.{SCHEMA}.{table} AT (VERSION => {version})"
