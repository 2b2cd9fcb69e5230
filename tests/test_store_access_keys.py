"""Short-lived keys in the store (kimiaudio/store/access_keys.py), on SQLite and PostgreSQL: only
their hash is stored, they expire by the store's clock, expired ones are swept when a key is
minted, and a key minted through one store is found through another on the same database."""

import pytest

from kimiaudio.store import ConversationStore
from kimiaudio.store.access_keys import delete_key, find_key, key_hash, mint_key


async def test_a_key_is_found_by_itself_only_and_stored_as_a_hash(store):
    now = [1000.0]
    store.clock = lambda: now[0]
    session = {"type": "realtime", "instructions": "Be brief."}
    key, record = await mint_key(store, "ek_", "realtime", 60, session)
    assert key.startswith("ek_") and len(key) > 40
    assert (record.created_at, record.expires_at) == (1000.0, 1060.0)
    found = await find_key(store, key)
    assert found == record and found.session == session and not found.expired(now[0])
    assert await find_key(store, key + "x") is None and await find_key(store, key[:-1]) is None

    def stored(db):
        return db.execute("SELECT key_hash, session FROM access_keys").fetchall()

    rows = await store.read(stored)
    assert [row[0] for row in rows] == [key_hash(key)] and key not in repr(rows)

    other, _ = await mint_key(store, "ek_", "realtime", 60)
    assert other != key and (await find_key(store, other)).session is None
    await delete_key(store, other)
    assert await find_key(store, other) is None


async def test_keys_expire_by_the_clock_and_are_swept(store):
    now = [50.0]
    store.clock = lambda: now[0]
    short, _ = await mint_key(store, "ek_", "realtime", 10)
    page, _ = await mint_key(store, "", "page", 3600)
    now[0] = 60.0
    assert (await find_key(store, short)).expired(now[0])  # kept until the next mint, and known as expired
    assert not (await find_key(store, page)).expired(now[0])
    now[0] = 61.0
    await mint_key(store, "ek_", "realtime", 10)
    assert await find_key(store, short) is None and (await find_key(store, page)).scope == "page"


async def test_a_key_minted_on_one_instance_is_found_on_another(postgres_url):
    first, second = ConversationStore(postgres_url), ConversationStore(postgres_url)
    await first.open()
    await second.open()
    try:
        key, record = await mint_key(first, "ek_", "realtime", 600, {"type": "realtime"})
        assert await find_key(second, key) == record
    finally:
        await first.close()
        await second.close()


@pytest.mark.parametrize("scope", ["realtime", "page"])
async def test_scope_is_kept(store, scope):
    key, _ = await mint_key(store, "k_", scope, 5)
    assert (await find_key(store, key)).scope == scope
