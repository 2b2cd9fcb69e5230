"""PostgreSQL for the store: the start-up connection that checks and migrates the database, the
connection pool the writer and reader threads borrow from, and what a lost database becomes.

At start one plain connection is made first, so that a bad URL, an unreachable server or a
wrong password is one line naming the problem (`check_and_migrate`). While serving, every query
borrows a pooled connection that the pool checks first; a server gone away is a
StoreUnavailableError (the server answers 503), and the pool reconnects by itself once it is back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from kimiaudio.errors import KimiAudioError, StoreUnavailableError
from kimiaudio.store.location import shown, url_setting
from kimiaudio.store.schema import migrate
from kimiaudio.store.sql import PostgresSql

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

CONNECT_TIMEOUT_S = 5  # a server that does not answer at all
POOL_SIZE = 4  # the writer and reader threads, the lease heartbeat, /readyz
POOL_WAIT_S = 5.0  # a query waiting for a connection while the server is away
# Once a query has found the server away, the next ones wait this long, until one gets a
# connection: the writes queued behind it (a session's turn, its answer) fail in turn at once
# instead of each waiting out POOL_WAIT_S while the client hears nothing.
AWAY_WAIT_S = 0.5
# The pool retries a failed connection with a doubling back-off; it gives up after this, and the
# next query starts again from a short delay, so a server back after a long outage is found quickly.
RECONNECT_GIVE_UP_S = 10.0


def _one_line(exc: BaseException) -> str:
    """The message on one line, without a password (libpq quotes a URL it cannot parse)."""
    return shown(" ".join(str(exc).split())) or type(exc).__name__


def _is_connection_lost(exc: BaseException) -> bool:
    import psycopg

    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = getattr(exc, "sqlstate", None)
    # No SQLSTATE: the client's side of the connection failed; 08: connection exception;
    # 57P: the server is shutting down or restarting.
    return state is None or state.startswith(("08", "57P"))


def check_and_migrate(url: str) -> int:
    """Connect once, bring the schema up to date; the version found. Each problem is one
    KimiAudioError naming it."""
    import psycopg

    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.ProgrammingError as exc:  # the URL itself does not parse
        raise KimiAudioError(f"{url_setting()} {shown(url)}: not a usable PostgreSQL URL ({_one_line(exc)})") from None
    except psycopg.OperationalError as exc:
        raise KimiAudioError(f"cannot connect to the PostgreSQL database {shown(url)}: {_one_line(exc)}") from None
    with conn:
        try:
            return migrate(PostgresSql(conn), shown(url))
        except psycopg.Error as exc:
            raise KimiAudioError(
                f"PostgreSQL database {shown(url)}: cannot migrate its schema ({_one_line(exc)})"
            ) from None


def open_pool(url: str) -> ConnectionPool:
    from psycopg_pool import ConnectionPool

    pool = ConnectionPool(
        url,
        min_size=1,
        max_size=POOL_SIZE,
        timeout=POOL_WAIT_S,
        open=False,
        reconnect_timeout=RECONNECT_GIVE_UP_S,
        kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S},
        check=ConnectionPool.check_connection,
        name="kimiaudio-store",
    )
    pool.open(wait=True, timeout=CONNECT_TIMEOUT_S * 2)
    return pool


class PostgresConnector:
    """The store threads' access to the shared pool (db_thread.py): a connection per call."""

    def __init__(self, pool, url: str):
        self.pool, self.url = pool, url
        self.wait_s = POOL_WAIT_S  # AWAY_WAIT_S from a query that found the server away to one that did not

    @contextlib.contextmanager
    def session(self) -> Iterator[PostgresSql]:
        from psycopg_pool import PoolTimeout

        try:
            with self.pool.connection(timeout=self.wait_s) as conn:
                self.wait_s = POOL_WAIT_S
                yield PostgresSql(conn)
        except PoolTimeout:
            self.wait_s = AWAY_WAIT_S
            raise StoreUnavailableError(f"the database {shown(self.url)} does not answer") from None
        except Exception as exc:
            if _is_connection_lost(exc):
                self.wait_s = AWAY_WAIT_S
                raise StoreUnavailableError(
                    f"the database {shown(self.url)} is unreachable ({_one_line(exc)})"
                ) from None
            raise

    def close(self) -> None:
        pass  # the pool is the store's
