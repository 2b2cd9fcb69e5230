"""The shared directory of live calls (kimiaudio/store/calls.py), on SQLite and PostgreSQL: a call
is registered by the instance that holds it, renewed by its syncs, marked for hang-up by
anyone, found marked by its holder only, forgotten when it ends or when its holder stops
renewing it."""

from kimiaudio.store import ConversationStore, schema
from kimiaudio.store.calls import register_call, request_hangup, sync_calls


async def test_a_hangup_marked_anywhere_reaches_the_holder(store):
    now = [100.0]
    store.clock = lambda: now[0]
    holder = store.instance_id
    await register_call(store, "rtc_a", 10)
    await register_call(store, "rtc_b", 10)
    assert await sync_calls(store, ["rtc_a", "rtc_b"], [], 10) == []
    assert not await request_hangup(store, "rtc_b")  # the holder ends its own calls itself
    store.instance_id = "another instance"  # its syncs see none of the holder's calls
    assert await request_hangup(store, "rtc_b") and not await request_hangup(store, "rtc_unknown")
    assert await sync_calls(store, [], [], 10) == []
    store.instance_id = holder
    assert await sync_calls(store, ["rtc_a", "rtc_b"], [], 10) == ["rtc_b"]
    assert await sync_calls(store, ["rtc_a"], ["rtc_b"], 10) == []  # ended: forgotten
    store.instance_id = "another instance"
    assert not await request_hangup(store, "rtc_b")


async def test_the_calls_of_an_instance_that_stopped_renewing_expire(store):
    now = [100.0]
    store.clock = lambda: now[0]
    await register_call(store, "rtc_a", 10)
    store.instance_id = "another instance"
    now[0] = 109.0
    assert await request_hangup(store, "rtc_a")
    now[0] = 111.0  # no sync renewed it: its instance is gone
    assert not await request_hangup(store, "rtc_a")


async def test_a_version_7_database_without_the_calls_table_gets_one(store_location, monkeypatch):
    """Databases of version 7 that hold access_keys but no calls table (migration 7 once made
    only the former) get it when migrated: a call can be registered and hung up on them."""
    monkeypatch.setattr(schema, "SCHEMA_VERSION", 7)
    old = ConversationStore(store_location)
    await old.open()
    await old.write(lambda db: db.execute("DROP TABLE calls"))
    await old.close()
    monkeypatch.undo()
    store = ConversationStore(store_location)
    await store.open()
    try:
        await register_call(store, "rtc_a", 10)
        store.instance_id = "another instance"
        assert await request_hangup(store, "rtc_a")
        assert await store.integrity_problems() == []
    finally:
        await store.close()
