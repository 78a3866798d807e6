"""The reference worker's schema satisfies the contract's DDL (harness/contract/schema.sql):
every table, column, type, nullability and key of it, row level security on
every tenant table keyed on session_tenant(), and the group roles."""

from __future__ import annotations

from harness.contract import catalog
from harness.parts.postgres import PostgresCluster


def test_reference_schema_satisfies_schema_sql(
    pg_cluster: PostgresCluster, ref_template: str
) -> None:
    expected = catalog.expected_catalog(pg_cluster)
    found = catalog.read_catalog(pg_cluster, ref_template)
    gaps, notes = catalog.compare(expected, found)
    assert gaps == [], "\n".join(g.line() for g in gaps)
    assert notes == []
    assert set(expected.tables) <= set(found.tables)


def test_schema_sql_applies_twice(pg_cluster: PostgresCluster) -> None:
    """A worker may apply it in a migrate that runs again (idempotent)."""
    db = pg_cluster.create_database(prefix="fc_schema_twice")
    try:
        for _ in range(2):
            pg_cluster.query(catalog.SCHEMA_SQL.read_text(), dbname=db.name)
        tables = catalog.read_catalog(pg_cluster, db.name).tables
        assert {"agent_runs", "tenant_bindings", "outbox"} <= set(tables)
    finally:
        pg_cluster.drop_database(db.name)
