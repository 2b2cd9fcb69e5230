"""The shared store: migrations by concurrent starters, refusals at start, leases between
instances, voices and spoken answers across instances (store/postgres.py, leases.py,
schema.py), on the tests' own PostgreSQL server; leases within one instance on both backends."""

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psycopg
import pytest

from kimiaudio.errors import KimiAudioError, StoreUnavailableError
from kimiaudio.store import SCHEMA_VERSION, ConversationBusyError, ConversationLostError, ConversationStore, delete_turn
from kimiaudio.store.answer_store import load_answer, new_answer_id, save_answer
from kimiaudio.store.location import shown
from kimiaudio.store.postgres import AWAY_WAIT_S, POOL_WAIT_S, PostgresConnector, check_and_migrate, open_pool
from kimiaudio.store.voice_store import delete_voice, load_voices, save_voice, voice_names

from helpers.serve_process import free_port
from helpers.waiting import eventually

ROOT = Path(__file__).resolve().parent.parent


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_concurrent_starters_migrate_exactly_once(postgres_url):
    barrier = threading.Barrier(4)
    found: list[int] = []
    errors: list[BaseException] = []

    def start():
        barrier.wait()
        try:
            found.append(check_and_migrate(postgres_url))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    # One found the empty database and migrated it; the others waited and found it current.
    assert sorted(found) == [0, SCHEMA_VERSION, SCHEMA_VERSION, SCHEMA_VERSION]
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT version FROM kimiaudio_schema").fetchall() == [(SCHEMA_VERSION,)]


def _serve(env_url: str, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KIMIAUDIO_DATABASE_URL": env_url}
    return subprocess.run(
        [sys.executable, "-m", "kimiaudio", "serve", "--data-dir", str(tmp_path), "--port", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_serve_refuses_a_bad_database_with_one_line(postgres_server, postgres_url, tmp_path):
    check_and_migrate(postgres_url)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("UPDATE kimiaudio_schema SET version = %s", [SCHEMA_VERSION + 3])
    dbname = postgres_url.rsplit("/", 1)[1]
    cases = [
        (postgres_server.url(dbname, password="wrong"), "password authentication failed"),
        ("https://example.org/db", "KIMIAUDIO_DATABASE_URL: expected empty"),
        ("postgresql://kimiaudio:x@[::1/x", "KIMIAUDIO_DATABASE_URL postgresql://kimiaudio:***@[::1/x: not a usable"),
        # Which database, and the variable that named it (it wins over storage.url).
        (
            postgres_url,
            f"{shown(postgres_url)}: database schema version {SCHEMA_VERSION + 3} is newer than this kimiaudio",
        ),
        (postgres_url, "point KIMIAUDIO_DATABASE_URL, storage.url or storage.data_dir at another database"),
    ]
    for url, problem in cases:  # each is a start of serve: the few that differ on its path
        proc = _serve(url, tmp_path)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode != 0 and len(lines) == 1 and problem in lines[0], (url, proc.stderr)
        assert postgres_server.password not in proc.stderr + proc.stdout
        assert "Loading" not in proc.stdout  # refused before the model was loaded


def test_unusable_urls_are_one_line_each(postgres_server):
    cases = [
        (f"postgresql://kimiaudio:secret@127.0.0.1:{free_port()}/x", "Connection refused"),  # nothing listens
        (postgres_server.url("no_such_database"), 'database "no_such_database" does not exist'),
        (f"postgresql://kimiaudio:secret@127.0.0.1:{postgres_server.port}/x?sslmode=bogus", "invalid sslmode"),
        ("postgresql://kimiaudio:secret@[::1/x", "not a usable PostgreSQL URL"),
    ]
    for url, problem in cases:
        with pytest.raises(KimiAudioError) as refused:
            check_and_migrate(url)
        message = str(refused.value)
        assert problem in message and "\n" not in message and "secret" not in message and "***" in message


async def test_a_role_that_only_reads_and_writes_rows_serves_a_current_schema(postgres_server, postgres_url):
    """An operator may run the instances as a role with rights on the rows only (the schema
    migrated by its owner): with nothing to migrate, it is no reason to refuse it."""
    import secrets

    check_and_migrate(postgres_url)
    role, password = f"rows_{secrets.token_hex(4)}", secrets.token_hex(8)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}")
        conn.execute(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {role}")
    url = postgres_url.replace(f"kimiaudio:{postgres_server.password}@", f"{role}:{password}@", 1)
    assert check_and_migrate(url) == SCHEMA_VERSION
    store = await _store(url)
    try:
        conversation = (await store.create_conversation())["id"]
        await store.add_turn(conversation, "user", "hello")
        assert [t["text"] for t in (await store.get_conversation(conversation))["turns"]] == ["hello"]
    finally:
        await store.close()


def test_newer_schema_is_refused_by_the_store(postgres_url):
    check_and_migrate(postgres_url)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("UPDATE kimiaudio_schema SET version = %s", [SCHEMA_VERSION + 1])
    with pytest.raises(KimiAudioError, match="newer than this kimiaudio"):
        check_and_migrate(postgres_url)


async def _store(location, **kwargs) -> ConversationStore:
    store = ConversationStore(location, **kwargs)
    await store.open()
    return store


async def test_a_conversation_is_held_by_one_session(store_location):
    store = await _store(store_location, lease_seconds=30.0)
    try:
        conversation = (await store.create_conversation())["id"]
        await store.leases.acquire(conversation, "sess_a")
        await store.leases.acquire(conversation, "sess_a")  # its own: renewed
        with pytest.raises(ConversationBusyError) as busy:
            await store.leases.acquire(conversation, "sess_b")
        assert 1.0 <= busy.value.retry_after_s <= 30.0
        with pytest.raises(ConversationBusyError):  # not deleted under its live session either
            await store.delete_conversation(conversation)
        await store.leases.release(conversation, "sess_a")
        await store.leases.acquire(conversation, "sess_b")
        with pytest.raises(KimiAudioError, match="no conversation with id 'nope'"):
            await store.leases.acquire("nope", "sess_b")
    finally:
        await store.close()


async def test_lease_busy_elsewhere_then_taken_over_with_the_heard_answer(postgres_url):
    clock = Clock()
    # The first instance's heartbeat never fires within the test (a long lease): as if killed
    # right after its last renewal.
    first = await _store(postgres_url, lease_seconds=5.0, clock=clock)
    second = await _store(postgres_url, lease_seconds=5.0, clock=clock)
    try:
        conversation = (await first.create_conversation())["id"]
        await first.leases.acquire(conversation, "sess_1")
        await first.add_turn(conversation, "user", audio=np.full(16000, 0.1, np.float32))
        index = await first.add_turn(conversation, "assistant", "", interrupted=True)
        heard = np.linspace(-0.5, 0.5, 24000, dtype=np.float32)
        await first.append_heard(conversation, index, heard, "Hello")

        with pytest.raises(ConversationBusyError) as busy:
            await second.leases.acquire(conversation, "sess_2")
        assert busy.value.retry_after_s == 5.0
        # Another instance starting meanwhile leaves the live answer's parts alone.
        third = await _store(postgres_url, clock=clock)
        await third.close()
        assert not (await second.get_conversation(conversation))["turns"][index]["has_audio"]

        clock.now += 3.0
        with pytest.raises(ConversationBusyError) as busy:
            await second.leases.acquire(conversation, "sess_2")
        assert busy.value.retry_after_s == 2.0
        clock.now += 2.5  # past the expiry: nobody renewed it
        await second.leases.acquire(conversation, "sess_2")
        history = await second.load_history(conversation)
        assert [t.role for t in history] == ["user", "assistant"] and history[index].text == "Hello"
        assert np.allclose(history[index].audio, heard, atol=1e-4)
        with pytest.raises(ConversationBusyError):  # the old holder lost it
            await first.leases.acquire(conversation, "sess_1")
        assert await second.integrity_problems() == []
    finally:
        await first.close()
        await second.close()


async def test_a_lease_taken_over_refuses_its_old_holders_writes_and_tells_it(postgres_url):
    clock = Clock()
    # The first instance's heartbeat never fires within the test (a long lease); the second's
    # clock is past that lease's expiry: as for an instance that looked once the first had been
    # cut off from the database for longer than the lease.
    first = await _store(postgres_url, lease_seconds=30.0, clock=clock)
    second = await _store(postgres_url, lease_seconds=30.0, clock=lambda: clock.now + 60.0)
    try:
        conversation = (await first.create_conversation())["id"]
        lost: list[str] = []
        await first.leases.acquire(conversation, "sess_1", on_lost=lost.append)
        await first.add_turn(conversation, "user", "one", holder="sess_1")
        await second.leases.acquire(conversation, "sess_2")
        await second.add_turn(conversation, "user", "two", holder="sess_2")

        with pytest.raises(ConversationLostError, match="taken by another session"):
            await first.add_turn(conversation, "user", "three", holder="sess_1")
        with pytest.raises(ConversationLostError):
            await first.update_turn(conversation, 0, text="changed", holder="sess_1")
        with pytest.raises(ConversationLostError):
            await first.append_heard(conversation, 0, np.zeros(240, np.float32), "changed", holder="sess_1")
        with pytest.raises(ConversationLostError):
            await delete_turn(first, conversation, 0, "sess_1")
        assert lost == [conversation] and first.leases.held() == []  # told once, renewed no more
        turns = (await second.get_conversation(conversation))["turns"]
        assert [(t["index"], t["text"]) for t in turns] == [(0, "one"), (1, "two")]
    finally:
        await first.close()
        await second.close()


async def test_the_heartbeat_tells_the_holder_of_a_lease_taken_over(postgres_url):
    clock = Clock()
    first = await _store(postgres_url, lease_seconds=1.0, clock=clock)  # renewed every third of a second
    second = await _store(postgres_url, lease_seconds=30.0, clock=lambda: clock.now + 60.0)
    try:
        kept, taken = [(await first.create_conversation())["id"] for _ in range(2)]
        lost = asyncio.Event()
        told: list[str] = []

        def on_lost(conversation_id: str) -> None:
            told.append(conversation_id)
            lost.set()

        await first.leases.acquire(kept, "sess_1", on_lost=on_lost)
        await first.leases.acquire(taken, "sess_1", on_lost=on_lost)
        await second.leases.acquire(taken, "sess_2")  # expired for the second instance's clock
        await asyncio.wait_for(lost.wait(), 30)  # catches a hang
        assert told == [taken] and first.leases.held() == [(kept, "sess_1")]
        with pytest.raises(ConversationBusyError):  # still the second's: no renewal took it back
            await first.leases.acquire(taken, "sess_1")
    finally:
        await first.close()
        await second.close()


async def test_voices_and_spoken_answers_are_shared(postgres_url):
    first = await _store(postgres_url)
    second = await _store(postgres_url)
    try:
        pcm = np.linspace(-0.3, 0.3, 48000, dtype=np.float32)
        saved = await save_voice(first, "narrator", pcm, 24000, [1, 2, 3])
        assert await voice_names(second) == {"narrator": saved.created_at}
        (voice,) = await load_voices(second)
        assert voice.codes == [1, 2, 3] and np.array_equal(voice.pcm, pcm)
        assert await delete_voice(second, "narrator") is True
        assert await voice_names(first) == {}

        answer_id = new_answer_id()
        await save_answer(first, answer_id, "hi there", [7, 8, 9], np.zeros(2400, np.float32), ttl_s=60.0)
        answer = await load_answer(second, answer_id)
        assert answer is not None and answer.text == "hi there" and answer.audio_tokens == [7, 8, 9]
    finally:
        await first.close()
        await second.close()


async def test_the_heartbeat_renews_live_leases_only(store_location):
    clock = Clock()
    store = await _store(store_location, lease_seconds=1.0, clock=clock)  # renewed every third of a second
    try:
        held, released = [(await store.create_conversation())["id"] for _ in range(2)]
        await store.leases.acquire(held, "sess_a")
        await store.leases.acquire(released, "sess_a")
        await store.leases.release(released, "sess_a")
        assert store.leases.held() == [(held, "sess_a")]
        clock.now += 0.9

        def expiry(db):
            return db.execute("SELECT expires_at FROM leases WHERE conversation_id = ?", [held]).fetchone()[0]

        async def renewed():  # the next heartbeat renews it from the clock's time
            return await store.read(expiry) == clock.now + 1.0

        await eventually(renewed, "the heartbeat renewing the lease")
        clock.now += 0.5  # past the first expiry: still held, renewed
        with pytest.raises(ConversationBusyError):
            await store.leases.acquire(held, "sess_b")
        await store.leases.acquire(released, "sess_b")
    finally:
        await store.close()


def test_a_failed_migration_rolls_back_entirely_on_postgresql(postgres_url, monkeypatch):
    from kimiaudio.store import schema

    bad = schema.MIGRATIONS + ["CREATE TABLE extra (x INTEGER); THIS IS NOT SQL"]
    monkeypatch.setattr(schema, "MIGRATIONS", bad)
    monkeypatch.setattr(schema, "SCHEMA_VERSION", len(bad))
    with pytest.raises(KimiAudioError, match="cannot migrate"):
        check_and_migrate(postgres_url)
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT version FROM kimiaudio_schema").fetchone()[0] == len(bad) - 1
        assert conn.execute("SELECT to_regclass('extra')").fetchone()[0] is None
        # The lock was let go: the next starter is not stuck behind it.
        assert conn.execute("SELECT pg_try_advisory_lock(1802071401)").fetchone()[0] is True


def test_the_environment_url_wins_and_bad_urls_name_their_key(monkeypatch, tmp_path):
    from kimiaudio.config import load_config
    from kimiaudio.errors import ConfigError
    from kimiaudio.store import DATABASE_URL_ENV, database_location

    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    config = load_config(None, {"storage": {"data_dir": str(tmp_path), "lease_seconds": 3.0}})
    assert database_location(config) == tmp_path / "kimiaudio.db"  # the embedded default
    config = load_config(None, {"storage": {"url": "postgresql://u:p@db.example:5432/k"}})
    assert database_location(config) == "postgresql://u:p@db.example:5432/k"
    monkeypatch.setenv(DATABASE_URL_ENV, "postgres://e:q@other:5432/k")
    assert database_location(config) == "postgres://e:q@other:5432/k"
    with pytest.raises(ConfigError, match="storage.url: expected empty"):
        load_config(None, {"storage": {"url": "mysql://u:p@h/db"}})
    with pytest.raises(ConfigError, match=r"storage.lease_seconds: expected a finite number in \[1.0, 3600.0\]"):
        load_config(None, {"storage": {"lease_seconds": 0.5}})


def test_a_database_gone_away_fails_fast_until_it_answers(postgres_server, postgres_url):
    """The first query that finds the server away waits for it (POOL_WAIT_S); the ones after it
    wait AWAY_WAIT_S, until one gets a connection again. The waits asked of the real pool are
    recorded, not timed."""
    pool = open_pool(postgres_url)
    connector = PostgresConnector(pool, postgres_url)
    asked: list[float] = []
    connection = pool.connection

    def recorded(timeout: float):
        asked.append(timeout)
        return connection(timeout=timeout)

    pool.connection = recorded

    def query() -> bool:
        try:
            with connector.session() as db:
                db.execute("SELECT 1")
            return True
        except StoreUnavailableError:
            return False

    try:
        assert query()
        postgres_server.stop()
        try:
            assert not query() and not query()
        finally:
            postgres_server.start()
        deadline = time.monotonic() + 120  # (catches a hang: the pool reconnects with a back-off)
        while not query():
            assert time.monotonic() < deadline, "no query answered once the database was back"
            time.sleep(0.2)
        assert query()
    finally:
        pool.close()
    assert asked[:3] == [POOL_WAIT_S, POOL_WAIT_S, AWAY_WAIT_S]  # answered, found it away, failed fast
    assert asked[-2:] == [AWAY_WAIT_S, POOL_WAIT_S]  # the query that got through, and the one after it
