"""Resource sets: stored under an id, versioned, the most recently touched one the latest."""

from __future__ import annotations

import sqlite3

from ..errors import ConflictError
from ..models import NamedResources, ResourcesUpdate
from .schema import RESOURCES_COLUMNS, resources_from_row
from .transactions import Txn, fetchone, next_counter


def latest_resources_id(conn: sqlite3.Connection) -> str | None:
    row = fetchone(conn, "SELECT resources_id FROM resources ORDER BY touched DESC LIMIT 1")
    return None if row is None else row[0]


def put_resources(txn: Txn, resources_id: str, encoded: tuple[NamedResources, bytes], update: bool) -> ResourcesUpdate:
    resources, blob = encoded
    touched = next_counter(txn.conn, "resources")
    row = fetchone(txn.conn, "SELECT create_time, version FROM resources WHERE resources_id = ?", (resources_id,))
    if row is None:
        create_time, version = txn.now, 1
        txn.conn.execute(
            "INSERT INTO resources (resources_id, create_time, update_time, version, resources, touched) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (resources_id, create_time, txn.now, version, blob, touched),
        )
    elif not update:
        raise ConflictError(f"resources {resources_id!r} already exist")
    else:
        create_time, version = row[0], row[1] + 1
        txn.conn.execute(
            "UPDATE resources SET update_time = ?, version = ?, resources = ?, touched = ? WHERE resources_id = ?",
            (txn.now, version, blob, touched, resources_id),
        )
    return ResourcesUpdate(
        resources_id=resources_id, create_time=create_time, update_time=txn.now, version=version, resources=resources
    )


def get_resources(conn: sqlite3.Connection, resources_id: str | None) -> ResourcesUpdate | None:
    if resources_id is None:
        row = fetchone(conn, f"SELECT {RESOURCES_COLUMNS} FROM resources ORDER BY touched DESC LIMIT 1")
    else:
        row = fetchone(conn, f"SELECT {RESOURCES_COLUMNS} FROM resources WHERE resources_id = ?", (resources_id,))
    return None if row is None else resources_from_row(row)
