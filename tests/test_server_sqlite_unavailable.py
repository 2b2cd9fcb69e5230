"""A SQLite file that cannot be written for a while (its disk full) on the real app: the writes
that need room are 503 `database_unavailable` with Retry-After, as a PostgreSQL server gone away
is (test_server_shared_store.py), never a 500; reads still answer, and once there is room again
the same writes succeed without a restart."""

import pytest

from kimiaudio.server.context import SERVER_CONTEXT
from kimiaudio.server.middleware.access import API_KEY_ENV

from helpers.metrics_scrape import scrape

# A session bound to an ephemeral key is stored with it: instructions this long need new pages.
LONG_SESSION = {"type": "realtime", "model": "gpt-realtime", "instructions": "Speak slowly. " * 2000}


def _hold_size(db, pages: int) -> None:
    # The file may not grow past `pages` (a count below its size holds it at its size): what a
    # full disk does to every write that needs a new page.
    db.execute(f"PRAGMA max_page_count = {pages}").fetchone()


async def test_a_full_disk_is_503_until_there_is_room_again(monkeypatch, demo_server):
    openai = pytest.importorskip("openai")
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    async with demo_server() as (http, _):
        store = http.app[SERVER_CONTEXT].store
        api = openai.AsyncOpenAI(base_url=str(http.make_url("/v1")), api_key="unused", max_retries=0)
        try:
            await store.write(_hold_size, 1)
            with pytest.raises(openai.APIStatusError) as refused:
                await api.realtime.client_secrets.create(session=LONG_SESSION)
            listed = await http.get("/api/conversations")
            await store.write(_hold_size, 2**30)
            secret = await api.realtime.client_secrets.create(session=LONG_SESSION)
        finally:
            await api.close()
    assert refused.value.status_code == 503, refused.value.body
    assert refused.value.body["code"] == "database_unavailable"
    assert "full" in refused.value.body["message"]
    assert refused.value.response.headers["Retry-After"].isdigit()
    assert listed.status == 200
    assert secret.value.startswith("ek_")


def _read_only(db) -> None:
    # What a file made read-only under the server does to every write.
    db.execute("PRAGMA query_only = ON").fetchone()


async def test_a_streamed_answer_that_cannot_be_stored_ends_with_a_counted_error(monkeypatch, demo_server):
    """A spoken answer streamed while the file cannot be written: its audio id cannot be kept, which the
    stream's `error` event says (the 200 is sent), and kimiaudio_errors_total counts it, as it
    counts the same failure answered with a 503 before a stream opens."""
    openai = pytest.importorskip("openai")
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    async with demo_server() as (http, _):
        api = openai.AsyncOpenAI(base_url=str(http.make_url("/v1")), api_key="unused", max_retries=0)
        try:
            await http.app[SERVER_CONTEXT].store.write(_read_only)
            stream = await api.chat.completions.create(
                model="kimi-audio-7b-instruct",
                messages=[{"role": "user", "content": "Hi"}],
                modalities=["text", "audio"],
                audio={"voice": "alloy", "format": "pcm16"},
                stream=True,
            )
            with pytest.raises(openai.APIError) as failed:
                async for _ in stream:
                    pass
        finally:
            await api.close()
        metrics = await scrape(http)
    assert failed.value.code == "database_unavailable", failed.value.body
    assert metrics["kimiaudio_errors_total{kind=database_unavailable,source=stream}"] == 1
