"""The one line a failed command prints for a database error says what to do about it: a bad
connection option is the URL's fault, and ``kortex migrate`` is never its own remedy."""

from __future__ import annotations

import sqlite3

import psycopg
import sqlalchemy.exc

from kortex_cli.failures import describe


def test_a_connection_option_the_driver_rejects_points_at_the_url() -> None:
    exc = sqlalchemy.exc.ProgrammingError(None, None, psycopg.ProgrammingError("bad value for connect_timeout: 'abc'"))
    for line in (describe(exc), describe(exc, migrating=True)):
        assert "bad value for connect_timeout: 'abc'" in line and "KORTEX_DATABASE_URL" in line
        assert "migrate" not in line


def test_a_refused_query_suggests_migrating_except_to_migrate_itself() -> None:
    exc = sqlalchemy.exc.ProgrammingError("SELECT 1 FROM turns", {}, psycopg.ProgrammingError(
        'relation "turns" does not exist'))
    assert "run 'kortex migrate'" in describe(exc)
    line = describe(exc, migrating=True)
    assert 'relation "turns" does not exist' in line and "migrate'" not in line


def test_a_file_that_is_not_a_database() -> None:
    exc = sqlalchemy.exc.DatabaseError("SELECT 1", {}, sqlite3.DatabaseError("file is not a database"))
    line = describe(exc)
    assert line.startswith("cannot use the database (file is not a database)") and "KORTEX_DATABASE_URL" in line


def test_a_broken_constraint_is_not_blamed_on_the_url() -> None:
    exc = sqlalchemy.exc.IntegrityError("INSERT", {}, sqlite3.IntegrityError("UNIQUE constraint failed"))
    assert describe(exc).startswith("unexpected IntegrityError")
