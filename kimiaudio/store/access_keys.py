"""Short-lived keys the server hands out, kept in the shared database (table access_keys).

Two kinds, told apart by their `scope`: ephemeral Realtime keys (`ek_...`, minted by
POST /v1/realtime/client_secrets with the server's API key: they open a Realtime session or
call, with the session configuration bound to them) and the demo page's sign-ins (the
cookie a browser gets for the API key it typed once). A key is `prefix` + 32 random bytes
(secrets.token_urlsafe): unguessable. Only its digest is stored, so the database (a backup,
a dump) holds no key anyone could present; a lookup digests what was presented. The digest is
keyed by the `issuer`, the server's API key that the key was minted under (HMAC-SHA-256; plain
SHA-256 on a server without one): a key stands for the API key it was minted with, so once an
operator changes the API key, every key issued under the old one is unknown, as the old key is.
Because the table is in the database every instance shares, a key minted by one instance is
honoured by all of them. Expired rows are deleted whenever a key is minted. Times come from the
store's clock (injectable in tests).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import Any

from kimiaudio.store.conversation_store import ConversationStore
from kimiaudio.store.sql import Sql

KEY_BYTES = 32


@dataclass(frozen=True)
class AccessKey:
    scope: str
    created_at: float
    expires_at: float
    session: dict[str, Any] | None  # the configuration bound to it (ephemeral Realtime keys)

    def expired(self, now: float) -> bool:
        return now >= self.expires_at


def key_hash(key: str, issuer: str = "") -> str:
    data = key.encode("utf-8", "surrogateescape")
    if not issuer:
        return hashlib.sha256(data).hexdigest()
    return hmac.new(issuer.encode("utf-8", "surrogateescape"), data, hashlib.sha256).hexdigest()


async def mint_key(
    store: ConversationStore,
    prefix: str,
    scope: str,
    ttl_s: float,
    session: dict[str, Any] | None = None,
    issuer: str = "",
) -> tuple[str, AccessKey]:
    """A new key (`prefix` + random) valid for `ttl_s` seconds from now -> (the key, its record)."""
    key = prefix + secrets.token_urlsafe(KEY_BYTES)
    now = store.clock()
    record = AccessKey(scope, now, now + ttl_s, session)
    await store.write(_insert, key_hash(key, issuer), record)
    return key, record


async def find_key(store: ConversationStore, key: str, issuer: str = "") -> AccessKey | None:
    """The record of a key minted under `issuer` (expired or not, unless deleted since), or None
    if it is no key of ours."""
    return await store.read(_select, key_hash(key, issuer))


async def delete_key(store: ConversationStore, key: str, issuer: str = "") -> None:
    await store.write(_delete, key_hash(key, issuer))


def _insert(db: Sql, digest: str, record: AccessKey) -> None:
    with db.atomic():
        db.execute("DELETE FROM access_keys WHERE expires_at < ?", [record.created_at])
        db.insert(
            "access_keys",
            {
                "key_hash": digest,
                "scope": record.scope,
                "created_at": record.created_at,
                "expires_at": record.expires_at,
                "session": None if record.session is None else json.dumps(record.session),
            },
        )


def _select(db: Sql, digest: str) -> AccessKey | None:
    row = db.execute(
        "SELECT scope, created_at, expires_at, session FROM access_keys WHERE key_hash = ?", [digest]
    ).fetchone()
    if row is None:
        return None
    return AccessKey(row[0], row[1], row[2], None if row[3] is None else json.loads(row[3]))


def _delete(db: Sql, digest: str) -> None:
    db.execute("DELETE FROM access_keys WHERE key_hash = ?", [digest])
