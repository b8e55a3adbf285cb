"""The current members of every audience file (config/audiences/<name>.sql), evaluated by
mallard.audiences: one row per audience with a null customer_id (its file, and its error when
it did not run), and one row per (audience, customer id its select returned, regulated customers
left out). Ids only: a pass writes this whole table, and audience_members looks up the tenancy
columns of the customers who enter. A Python model so that each file runs in a statement of its
own and a broken one fails alone, naming itself (docs/audiences.md)."""

from mallard.audiences import build


def model(dbt, session):
    dbt.config(materialized="table")
    # The marts an audience's select reads are built first; the select reads them by name (the
    # search path of `mallard sql`). `customers` is a view over these and audience_members, so
    # it is not referenced here: an audience reading it sees the previous pass's audiencesStatic.
    dbt.ref("customer_profiles")
    dbt.ref("customer_event_objects")
    dbt.ref("customer_identifier_sightings")
    dbt.ref("events")
    result = "mallard_audience_matches"
    build(session, result)
    return session.table(result)
