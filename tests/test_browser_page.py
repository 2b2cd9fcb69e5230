"""The demo page in headless Chromium against the real server and pipeline (demo weights):
connect with a fake microphone playing espeak speech, complete a turn, see the assistant's
text, the demo banner and the readable errors (server full, microphone denied), the list of
conversations searched and shown a page at a time, who is speaking during a barge-in, and why
a call ended when the server said why (it shuts down)."""

import asyncio
from pathlib import Path

import pytest

from kimiaudio.bench.loopback_client import RtcClient, ScriptedMic
from kimiaudio.config import Config
from kimiaudio.server.app import create_app
from kimiaudio.server.context import SERVER_CONTEXT

from helpers.audio import silence, write_clip
from helpers.browser import (
    BROWSER_MARKS,
    console_errors,
    page_after_events,
    start_chromium,
    store_numbered_conversations,
    wait_for_script,
)
from helpers.waiting import eventually

ARTIFACTS = Path(__file__).parent / "artifacts"

pytestmark = BROWSER_MARKS


@pytest.fixture
async def server(aiohttp_client, demo_checkpoint, tmp_path):
    from kimiaudio.pipeline.model_stack import ModelStack
    from kimiaudio.pipeline.pipeline import Pipeline

    config = Config()
    config.model.path, config.model.device = str(demo_checkpoint), "cpu"
    config.storage.data_dir = str(tmp_path / "data")
    config.engine.num_kv_blocks = 256
    config.sampling.max_new_tokens = 60
    config.vad.silence_ms = 400
    config.server.max_sessions = 1
    stack = await asyncio.to_thread(ModelStack.load, config)
    pipeline = Pipeline(stack, config)
    await pipeline.start()
    http = await aiohttp_client(create_app(config, stack, pipeline))
    yield http
    await http.close()
    await pipeline.stop()


async def test_page_completes_a_turn_and_shows_the_text(server, tmp_path, speech):
    # Two utterances far apart: the random demo weights sometimes answer with no text at
    # all (an immediate end of text), so the test waits for an answer that has some.
    hello = speech[0]
    wav = write_clip(tmp_path / "mic.wav", [silence(1.0), hello, silence(6.0), hello, silence(20.0)])
    url = str(server.make_url("/"))

    def drive():
        driver = start_chromium(tmp_path, wav)
        try:
            driver.get(url)
            wait_for_script(driver, "return !document.getElementById('demo-banner').hidden")
            driver.find_element("id", "connect").click()
            wait_for_script(
                driver,
                """
                return [...document.querySelectorAll('#transcript .turn.assistant[data-status]')]
                    .filter((r) => ['completed', 'incomplete'].includes(r.dataset.status))
                    .some((r) => r.querySelector('.text').textContent !== '(no text)');""",
            )
            wait_for_script(driver, "return document.querySelectorAll('#conversations li:not(.muted)').length > 0")
            # The user's words ([server] transcribe_input is on by default) replace "You spoke".
            wait_for_script(
                driver, "return document.querySelector('#transcript .turn.user[data-transcribed]') !== null"
            )
            ARTIFACTS.mkdir(exist_ok=True)
            driver.save_screenshot(str(ARTIFACTS / "browser_turn.png"))
            return {
                "assistant": driver.execute_script("""
                    return [...document.querySelectorAll('#transcript .turn.assistant[data-status]')].map((r) => [
                        r.dataset.status, r.querySelector('.text').textContent,
                        r.querySelector('.meta').textContent]);"""),
                "user_turns": len(driver.find_elements("css selector", "#transcript .turn.user")),
                "user_words": driver.execute_script("""
                    return [...document.querySelectorAll('#transcript .turn.user[data-transcribed="completed"]')]
                        .map((u) => u.querySelector('.text').textContent);"""),
                "banner": driver.find_element("id", "demo-banner").text,
                "error_hidden": driver.execute_script("return document.getElementById('error-banner').hidden"),
                "console_errors": console_errors(driver),
            }
        finally:
            driver.quit()

    result = await asyncio.to_thread(drive)
    assert "Demo weights" in result["banner"] and "--model" in result["banner"]
    assert result["error_hidden"] and result["console_errors"] == []
    assert result["user_turns"] >= 1
    store = server.app[SERVER_CONTEXT].store
    conversations = await store.list_conversations()
    assert len(conversations) == 1
    stored = [t for t in (await store.get_conversation(conversations[0]["id"]))["turns"] if t["role"] == "assistant"]
    # What the page shows is what the server generated and stored, streamed delta by delta.
    # On a loaded machine an answer may still play when the second utterance starts: that one
    # is cut by the barge-in, and stored as interrupted.
    for (status, text, meta), turn in zip(result["assistant"], stored):
        assert status in ("completed", "incomplete", "cancelled")
        if status == "cancelled":
            assert turn["interrupted"]
            continue
        assert "first audio after" in meta and not turn["interrupted"]
        assert text == (turn["text"] or "(no text)")
    assert any(status in ("completed", "incomplete") for status, _, _ in result["assistant"])
    assert any(text != "(no text)" for _, text, _ in result["assistant"])
    # The user's line shows the words the server transcribed and stored with the turn.
    transcripts = [
        t["transcript"] for t in (await store.get_conversation(conversations[0]["id"]))["turns"] if t["role"] == "user"
    ]
    assert result["user_words"] and all(
        w == (t or "(no words heard)") for w, t in zip(result["user_words"], transcripts)
    )


async def test_page_search_box_filters_the_conversations(server, tmp_path):
    store = server.app[SERVER_CONTEXT].store
    for words in ("the weather in Lisbon", "a recipe for bread"):
        conversation = await store.create_conversation()
        index = await store.add_turn(conversation["id"], "user", audio=silence(0.5))
        await store.update_turn(conversation["id"], index, transcript=words)
        await store.add_turn(conversation["id"], "assistant", f"About {words.split()[-1]}.")
    url = str(server.make_url("/"))

    def drive():
        driver = start_chromium(tmp_path, None)
        listed = (
            "return [...document.querySelectorAll('#conversations li:not(.muted)')]"
            ".map((li) => li.firstChild.textContent)"
        )
        try:
            driver.get(url)
            wait_for_script(driver, "return document.querySelectorAll('#conversations li:not(.muted)').length === 2")
            driver.find_element("id", "search").send_keys("lisb")
            wait_for_script(driver, "return document.querySelectorAll('#conversations li:not(.muted)').length === 1")
            found = driver.execute_script(listed)
            driver.find_element("id", "search").send_keys(" nothing-like-it")
            wait_for_script(driver, "return document.querySelector('#conversations li.muted') !== null")
            return found, driver.find_element("css selector", "#conversations li.muted").text
        finally:
            driver.quit()

    found, empty = await asyncio.to_thread(drive)
    assert found == ["About Lisbon."] and empty == "No conversation matches."


async def test_page_shows_older_conversations_on_request(server, tmp_path):
    """The list comes a page (100) at a time: the last item fetches the next page, once."""
    store = server.app[SERVER_CONTEXT].store
    await store_numbered_conversations(store, 101)
    url = str(server.make_url("/"))
    count = "return document.querySelectorAll('#conversations li:not(.more)').length"

    def drive():
        driver = start_chromium(tmp_path, None)
        try:
            driver.get(url)
            wait_for_script(driver, "return document.querySelector('#conversations li.more') !== null")
            shown = driver.execute_script(count)
            # Clicked twice before the page comes (a double click): it is added once.
            driver.execute_script(
                "const more = document.querySelector('#conversations li.more'); more.click(); more.click();"
            )
            wait_for_script(driver, "return document.querySelector('#conversations li.more') === null")
            titles = driver.execute_script(
                "return [...document.querySelectorAll('#conversations li')].map((li) => li.firstChild.textContent)"
            )
            return shown, titles, console_errors(driver)
        finally:
            driver.quit()

    shown, titles, errors = await asyncio.to_thread(drive)
    assert shown == 100 and titles == [f"Conversation {n}." for n in reversed(range(101))] and not errors


async def test_page_explains_server_full_and_mic_denied(server, tmp_path):
    # Occupy the only session slot with another client.
    holder = RtcClient(ScriptedMic())
    assert (await holder.connect(server))[0] == 201
    url = str(server.make_url("/"))

    def error_after_connect(allow_mic: bool) -> str:
        driver = start_chromium(tmp_path, None, allow_mic=allow_mic)
        try:
            driver.get(url)
            driver.find_element("id", "connect").click()
            return wait_for_script(
                driver,
                """
                const b = document.getElementById('error-banner');
                return !b.hidden && b.textContent;""",
            )
        finally:
            driver.quit()

    full = await asyncio.to_thread(error_after_connect, True)
    # One sentence, one retry hint: the server's message has its own, the page says Retry-After's.
    assert "server is full" in full and full.lower().count("try again") == 1 and "Try again in 10 seconds" in full
    denied = await asyncio.to_thread(error_after_connect, False)
    assert "Microphone access was denied" in denied
    await holder.close()


async def test_page_state_during_a_barge_in_and_the_reason_a_call_ends(server, tmp_path):
    """Talking over an answer: the answer's audio is cleared and the response ends while the
    user still speaks, and the page keeps saying so until the speech stops. A graceful server
    stop says why it ends the session, and the page keeps that reason as the call ends."""
    wav = write_clip(tmp_path / "mic.wav", [silence(60.0)])
    url = str(server.make_url("/"))
    state = "return document.getElementById('state').textContent"
    driver = await asyncio.to_thread(start_chromium, tmp_path, wav)

    # The server's events of a barge-in, in their order, as the channel delivers them.
    barge_in = (
        {"type": "output_audio_buffer.started", "response_id": "resp_1"},
        {"type": "input_audio_buffer.speech_started", "audio_start_ms": 0, "item_id": "item_1"},
        {"type": "output_audio_buffer.cleared", "response_id": "resp_1"},
        {"type": "response.done", "response": {"id": "resp_1", "status": "cancelled"}},
        {"type": "output_audio_buffer.stopped", "response_id": "resp_1"},
        {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": 900, "item_id": "item_1"},
    )

    def ended():
        wait_for_script(driver, "return document.body.dataset.state === 'disconnected'")
        return driver.find_element("id", "error-banner").text, console_errors(driver)

    try:
        seen = await asyncio.to_thread(page_after_events, driver, url, barge_in, state)
        await server.app[SERVER_CONTEXT].sessions.close_all()
        banner, errors = await asyncio.to_thread(ended)
    finally:
        await asyncio.to_thread(driver.quit)
    assert seen == ["speaking"] + ["you are speaking"] * 4 + ["thinking"]
    assert banner == "The server is shutting down. Press Connect to start again." and not errors


async def test_a_server_error_stays_shown_until_a_later_answer_ends_well(server, tmp_path):
    """A server `error` event's banner outlives the answer it came with (a storage error comes
    before that answer's response.done) and one that fails; the first later answer that ends
    well takes it down."""
    wav = write_clip(tmp_path / "mic.wav", [silence(60.0)])
    url = str(server.make_url("/"))
    shown = "return !document.getElementById('error-banner').hidden"
    driver = await asyncio.to_thread(start_chromium, tmp_path, wav)

    def response(rid: str, kind: str, status: str = "") -> dict:
        return {"type": f"response.{kind}", "response": {"id": rid, "status": status or "in_progress"}}

    events = (
        response("resp_1", "created"),
        {"type": "error", "error": {"code": "storage_failed", "message": "the answer could not be stored"}},
        response("resp_1", "done", "completed"),
        response("resp_2", "created"),
        response("resp_2", "done", "failed"),
        response("resp_3", "created"),
        response("resp_3", "done", "completed"),
    )

    def shown_after_each():
        return page_after_events(driver, url, events, shown), console_errors(driver)

    try:
        seen, errors = await asyncio.to_thread(shown_after_each)
    finally:
        await asyncio.to_thread(driver.quit)
    assert seen == [False] + [True] * 5 + [False] and not errors


async def test_a_turn_that_gets_no_answer_leaves_thinking(server, tmp_path):
    """A committed turn the server could not store or answer gets an `error` and no response:
    the page goes back to listening. The same error beside an answer being generated leaves
    the page thinking until that answer's response.done."""
    wav = write_clip(tmp_path / "mic.wav", [silence(60.0)])
    url = str(server.make_url("/"))
    state = "return document.body.dataset.state"
    driver = await asyncio.to_thread(start_chromium, tmp_path, wav)
    stopped = {"type": "input_audio_buffer.speech_stopped", "audio_end_ms": 900, "item_id": "item_1"}
    events = (
        stopped,
        {"type": "error", "error": {"code": "turn_failed", "message": "the turn could not be answered"}},
        stopped,
        {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}},
        {"type": "error", "error": {"code": "storage_failed", "message": "the answer could not be stored"}},
        {"type": "response.done", "response": {"id": "resp_1", "status": "completed"}},
        stopped,
        {"type": "error", "error": {"code": "storage_failed", "message": "the turn could not be stored"}},
    )
    try:
        seen = await asyncio.to_thread(page_after_events, driver, url, events, state)
        errors = await asyncio.to_thread(console_errors, driver)
    finally:
        await asyncio.to_thread(driver.quit)
    assert seen == ["thinking", "listening", "thinking", "thinking", "thinking", "listening", "thinking", "listening"]
    assert not errors


async def test_leaving_the_page_hangs_up_at_once(server, tmp_path, monkeypatch):
    """Reloading or closing the page ends its call then, so its session slot (the server's only
    one here) is free for the page that comes next. The server's other way to learn a client
    is gone, its ICE consent checks failing after about half a minute, is switched off here."""
    import aioice.ice

    monkeypatch.setattr(aioice.ice, "CONSENT_FAILURES", 10**9)
    wav = write_clip(tmp_path / "mic.wav", [silence(60.0)])
    url = str(server.make_url("/"))
    sessions = server.app[SERVER_CONTEXT].sessions
    driver = await asyncio.to_thread(start_chromium, tmp_path, wav)

    def call():
        driver.get(url)
        driver.find_element("id", "connect").click()
        wait_for_script(driver, "return document.body.dataset.state === 'listening'")

    async def slot_free() -> bool:
        return sessions.num_reserved == 0

    try:
        await asyncio.to_thread(call)
        assert sessions.num_reserved == 1
        await asyncio.to_thread(driver.get, "about:blank")  # the tab leaves the page
        await eventually(slot_free, "the call of the page left ended")
        await asyncio.to_thread(call)  # the next page gets the slot
        errors = await asyncio.to_thread(console_errors, driver)
    finally:
        await asyncio.to_thread(driver.quit)
    assert not errors


async def test_an_answer_cut_off_by_disconnect_is_marked_so(server, tmp_path):
    """Disconnect while an answer is still being generated: no response.done will come for it,
    so the page marks its line as cut short instead of leaving a partial text looking whole."""
    wav = write_clip(tmp_path / "mic.wav", [silence(60.0)])
    url = str(server.make_url("/"))
    events = (
        {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}},
        {"type": "response.output_audio_transcript.delta", "response_id": "resp_1", "delta": "Half an"},
    )
    line = "document.querySelector('.turn.assistant')"
    probe = f"return [{line}.classList.contains('interrupted'), {line}.dataset.status || '', {line}.textContent]"
    driver = await asyncio.to_thread(start_chromium, tmp_path, wav)

    def cut_off():
        before = page_after_events(driver, url, events, probe)[-1]
        driver.find_element("id", "connect").click()  # Disconnect
        wait_for_script(driver, "return document.body.dataset.state === 'disconnected'")
        return before, driver.execute_script(probe), console_errors(driver)

    try:
        before, after, errors = await asyncio.to_thread(cut_off)
    finally:
        await asyncio.to_thread(driver.quit)
    assert before[:2] == [False, ""] and "Half an" in before[2]
    assert after[:2] == [True, "cancelled"] and "Half an" in after[2] and "cut short" in after[2]
    assert not errors
