"""The server on a shared PostgreSQL database: a conversation another instance holds is 409
conversation_busy with Retry-After; a database lost while serving makes the requests that need
it 503, /readyz 503 and a Realtime session's reads `storage_failed` errors, and they recover
without a restart once it is back; a conversation another session took over while this one
could not renew its lease is lost to it (`conversation_lost`), and none of its later turns are
stored there; an answer whose final record the lost database missed keeps what was stored of it
as it played, joined into its turn's audio once the session lets the conversation go."""

import asyncio
import time

import aiohttp
import pytest

from kimiaudio.store import ConversationBusyError, ConversationStore

from helpers.demo_server import LONG_ANSWER
from helpers.hostile_clients import INTERNAL_NAMES, offer_sdp
from helpers.realtime_sessions import client_of, user_text
from helpers.voice_upload import form
from helpers.waiting import eventually

pytestmark = pytest.mark.slow


@pytest.fixture
async def shared(postgres_url, demo_server):
    """(test client of one instance, the store of another instance on the same database)."""
    elsewhere = ConversationStore(postgres_url, lease_seconds=30.0)
    await elsewhere.open()
    try:
        async with demo_server(storage_url=postgres_url) as (client, _):
            yield client, elsewhere
    finally:
        await elsewhere.close()


async def test_offer_for_a_conversation_held_elsewhere_is_409_with_retry_after(shared):
    http, elsewhere = shared
    conversation = (await elsewhere.create_conversation())["id"]
    await elsewhere.leases.acquire(conversation, "sess_elsewhere")
    listed = await (await http.get("/api/conversations")).json()
    assert conversation in [c["id"] for c in listed["conversations"]]  # the other instance's, listed here

    body = {"sdp": await offer_sdp(), "type": "offer", "conversation_id": conversation}
    resp = await http.post("/api/rtc/offer", json=body)
    assert resp.status == 409, await resp.text()
    assert (await resp.json())["error"]["code"] == "conversation_busy"
    assert 1 <= int(resp.headers["Retry-After"]) <= 30
    assert (await http.get("/api/status")).status == 200 and (await (await http.get("/api/status")).json())["sessions"][
        "active"
    ] == 0  # the refused session's slot is free again

    await elsewhere.leases.release(conversation, "sess_elsewhere")
    resp = await http.post("/api/rtc/offer", json=body)
    assert resp.status == 200, await resp.text()
    with pytest.raises(ConversationBusyError):  # now this instance's session holds it
        await elsewhere.leases.acquire(conversation, "sess_elsewhere")


async def _readyz(http) -> tuple[int, dict]:
    resp = await http.get("/readyz")
    return resp.status, await resp.json()


async def test_database_lost_then_back_without_a_restart(shared, postgres_server, caplog):
    http, elsewhere = shared
    conversation = (await elsewhere.create_conversation())["id"]
    assert (await _readyz(http))[0] == 200
    postgres_server.stop()
    try:
        status, body = await _readyz(http)
        assert status == 503 and "the conversation database does not answer" in body["problems"]
        resp = await http.get("/api/conversations")
        assert resp.status == 503 and resp.headers["Retry-After"]
        assert (await resp.json())["error"]["code"] == "database_unavailable"
        async with http.ws_connect("/v1/realtime") as ws:  # a session reading the store: told, no traceback
            await ws.send_json({"type": "conversation.select", "conversation_id": conversation})
            error = (await _event(ws, "error"))["error"]
        assert (error["code"], error["type"]) == ("storage_failed", "server_error"), error
        assert not INTERNAL_NAMES.search(error["message"]), error
        assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
    finally:
        postgres_server.start()

    async def ready_again():  # the pool reconnects by itself (with its back-off)
        return (await _readyz(http))[0] == 200

    await eventually(ready_again, "/readyz 200 once the database is back", interval=0.25)
    listed = await (await http.get("/api/conversations")).json()
    assert conversation in [c["id"] for c in listed["conversations"]]


async def test_an_answer_the_lost_database_did_not_finish_storing_is_joined_at_the_close(
    demo_server, postgres_server, postgres_url
):
    parts = "SELECT t.conversation_id FROM turn_audio_parts p JOIN turns t ON t.id = p.turn_id"
    reader = ConversationStore(postgres_url)
    await reader.open()
    try:
        async with demo_server(storage_url=postgres_url) as (http, pipeline):
            pipeline.answers_to_limit = True  # still playing when the database goes
            async with http.ws_connect("/v1/realtime") as ws:
                await ws.send_json({"type": "session.update", "session": {"sampling": LONG_ANSWER}})
                await _event(ws, "session.updated")
                await ws.send_json({"type": "conversation.item.create", "item": user_text("Tell me a story.")})
                await _event(ws, "conversation.item.done")
                await ws.send_json({"type": "response.create"})

                async def stored_as_it_plays():
                    return await reader.read(lambda db: db.execute(parts).fetchone())

                conversation = (await eventually(stored_as_it_plays, "a part of the answer stored", interval=0.1))[0]
                postgres_server.stop()
                try:
                    await ws.send_json({"type": "response.cancel"})  # its final record: now, and failing
                    while not (await _event(ws, "error"))["error"]["message"].startswith(
                        "the answer could not be stored ("
                    ):
                        pass
                finally:
                    postgres_server.start()

                async def ready_again():
                    return (await _readyz(http))[0] == 200

                await eventually(ready_again, "/readyz 200 once the database is back", interval=0.25)
                await ws.send_json({"type": "conversation.item.create", "item": user_text("And then?")})
                await _event(ws, "conversation.item.done")  # the session's writes are stored again

            async def joined():  # by the session's close, which releases the conversation
                turns = (await reader.get_conversation(conversation))["turns"]
                return turns if turns[1]["has_audio"] else None

            turns = await eventually(joined, "the answer's parts joined into its audio", interval=0.25)
            assert [t["role"] for t in turns] == ["user", "assistant", "user"]
            assert turns[1]["interrupted"] and turns[1]["duration_s"] > 0
            assert await reader.read(lambda db: db.execute(parts).fetchone()) is None
    finally:
        await reader.close()


async def _event(ws, kind: str) -> dict:
    while True:
        event = await asyncio.wait_for(ws.receive_json(), 120)  # catches a hang
        if event["type"] == kind:
            return event


async def test_realtime_select_of_a_held_conversation_is_an_error_and_close_releases(shared):
    http, elsewhere = shared
    held = (await elsewhere.create_conversation())["id"]
    free = (await elsewhere.create_conversation())["id"]
    await elsewhere.leases.acquire(held, "sess_elsewhere")
    async with http.ws_connect("/v1/realtime") as ws:
        await ws.send_json({"type": "conversation.select", "conversation_id": held})
        error = await _event(ws, "error")
        assert error["error"]["code"] == "conversation_busy"
        await ws.send_json({"type": "conversation.select", "conversation_id": free})
        assert (await _event(ws, "session.updated"))["session"]["conversation_id"] == free
        with pytest.raises(ConversationBusyError):
            await elsewhere.leases.acquire(free, "sess_elsewhere")

    async def released():  # the session's close releases its lease
        try:
            await elsewhere.leases.acquire(free, "sess_elsewhere")
            return True
        except ConversationBusyError:
            return False

    await eventually(released, "the closed session's lease released", interval=0.25)


async def test_a_conversation_taken_over_elsewhere_is_lost_and_stores_no_more_of_the_session(shared, postgres_url):
    http, elsewhere = shared
    conversation = (await elsewhere.create_conversation())["id"]
    # An instance whose clock is an hour ahead: the session's lease expired long ago for it, as
    # for one that looked once this instance had been cut off from the database that long.
    later = ConversationStore(postgres_url, lease_seconds=30.0, clock=lambda: time.time() + 3600.0)
    await later.open()
    try:
        async with http.ws_connect("/v1/realtime") as ws:
            await ws.send_json({"type": "conversation.select", "conversation_id": conversation})
            assert (await _event(ws, "session.updated"))["session"]["conversation_id"] == conversation
            await ws.send_json({"type": "conversation.item.create", "item": user_text("before")})
            await _event(ws, "conversation.item.done")

            await later.leases.acquire(conversation, "sess_later")
            await later.add_turn(conversation, "user", "elsewhere")
            error = await _event(ws, "error")  # the next renewal finds it out
            assert error["error"]["code"] == "conversation_lost"
            assert "taken by another session" in error["error"]["message"]
            assert (await _event(ws, "session.updated"))["session"]["conversation_id"] is None

            await ws.send_json({"type": "conversation.item.create", "item": user_text("after")})
            moved_to = (await _event(ws, "conversation.item.done"))["item"]
            await ws.send_json({"type": "response.create"})
            await _event(ws, "response.done")
        turns = (await elsewhere.get_conversation(conversation))["turns"]
        assert [t["text"] for t in turns] == ["before", "elsewhere"]
        assert moved_to["content"][0]["text"] == "after"
    finally:
        await later.close()


async def test_voices_are_shared_by_instances_on_one_database(tmp_path, postgres_url, espeak_voice, demo_server):
    async with (
        demo_server(tmp_path / "a", storage_url=postgres_url) as (a, pa),
        demo_server(tmp_path / "b", storage_url=postgres_url) as (b, pb),
    ):
        upload = aiohttp.FormData(default_to_multipart=True)
        upload.add_field("name", "shared-voice")
        upload.add_field("file", espeak_voice.read_bytes(), filename="voice.wav")
        resp = await a.post("/api/voices", data=upload)
        assert resp.status == 201, await resp.text()
        assert pa.stats()["voice_prefixes_cached"] == 1  # its device copy on instance a
        listed = await (await b.get("/api/voices")).json()
        assert [v["name"] for v in listed["voices"]] == ["shared-voice"] and "shared-voice" in pb.voices

        assert (await b.delete("/api/voices/shared-voice")).status == 200

        async def dropped():  # instance a notices at its next sync and drops its device copy
            return "shared-voice" not in pa.voices and pa.stats()["voice_prefixes_cached"] == 0

        await eventually(dropped, "instance a dropped the voice deleted through instance b", interval=0.25)
        assert (await (await a.get("/api/voices")).json())["voices"] == []


async def test_a_voice_added_through_one_instance_is_usable_through_another_at_once(
    tmp_path, postgres_url, espeak_voice, demo_server, monkeypatch
):
    """Behind a router, a client that adds a voice (one instance) and then uses it (another) must
    not be told it is unknown: the request naming it looks for it in the database. The
    background sync is kept from running, so only that look decides; each way of naming a voice
    gets one of its own."""
    from kimiaudio.server import stored_voices

    monkeypatch.setattr(stored_voices, "SYNC_INTERVAL_S", 3600.0)
    async with (
        demo_server(tmp_path / "a", storage_url=postgres_url) as (a, pa),
        demo_server(tmp_path / "b", storage_url=postgres_url) as (b, _),
    ):
        for name in ("for-update", "for-key", "for-chat", "for-call"):
            assert (await b.post("/api/voices", data=form(name, espeak_voice.read_bytes()))).status == 201
        assert not pa.voices.list()  # instance a has not synced

        async with a.ws_connect("/v1/realtime") as ws:
            await ws.send_json({"type": "session.update", "session": {"voice": "for-update"}})
            event = await _event_or_error(ws, "session.updated")
            assert event["type"] == "session.updated", event
            assert event["session"]["audio"]["output"]["voice"] == "for-update"
        assert "for-key" in pa.voices  # (that look registered every voice stored since)
        for name in ("for-key", "for-chat", "for-call"):  # forgotten again: each request below must look too
            pa.voices.remove(name)

        async with client_of(a) as openai:
            secret = await openai.realtime.client_secrets.create(
                session={"type": "realtime", "audio": {"output": {"voice": "for-key"}}}
            )
            assert secret.session.audio.output.voice == "for-key"
            pa.voices.remove("for-chat")
            completion = await openai.chat.completions.create(
                model="kimi-audio-7b-instruct",
                modalities=["text", "audio"],
                audio={"voice": "for-chat", "format": "wav"},
                messages=[{"role": "user", "content": "Hello."}],
                max_tokens=4,
            )
            assert completion.choices[0].message.audio is not None

        pa.voices.remove("for-call")
        call = aiohttp.FormData()
        call.add_field("sdp", await offer_sdp(), content_type="application/sdp")
        call.add_field("session", '{"type": "realtime", "audio": {"output": {"voice": "for-call"}}}')
        resp = await a.post("/v1/realtime/calls", data=call)
        assert resp.status == 201, await resp.text()
        assert (await a.post(resp.headers["Location"] + "/hangup")).status == 200

        async with a.ws_connect("/v1/realtime") as ws:  # a name stored nowhere is still refused
            await ws.send_json({"type": "session.update", "session": {"voice": "nowhere"}})
            event = await _event_or_error(ws, "session.updated")
            assert event["type"] == "error" and "unknown voice 'nowhere'" in event["error"]["message"], event


async def _event_or_error(ws, kind: str) -> dict:
    while True:
        event = await asyncio.wait_for(ws.receive_json(), 120)  # catches a hang
        if event["type"] in (kind, "error"):
            return event
