"""The demo page continues a stored conversation, in headless Chromium against the real server and
pipeline (demo weights): chosen before connecting, the call opens in it (?conversation_id= on
/v1/realtime/calls) and what is said next is answered with its history and stored in it;
chosen while connected, conversation.select moves the live call into it. Either way the server
says which conversation the call is in, and the page shows it."""

import asyncio

import pytest

from kimiaudio.server.context import SERVER_CONTEXT

from helpers.audio import silence, write_clip
from helpers.browser import BROWSER_MARKS, start_chromium, wait_for_script

pytestmark = BROWSER_MARKS

IN_SAVED = "return document.getElementById('conversation-note').textContent.includes('saved conversation')"


@pytest.fixture
async def stored(demo_server, tmp_path, speech):
    async with demo_server(tmp_path / "data") as (http, pipeline):
        store = http.app[SERVER_CONTEXT].store
        conversation = await store.create_conversation("Stored earlier")
        await store.add_turn(conversation["id"], "user", audio=speech[1], audio_tokens=[3, 4])
        await store.add_turn(conversation["id"], "assistant", "Earlier answer.", audio_tokens=[5])
        yield http, pipeline, conversation["id"]


def continue_stored(driver) -> None:
    wait_for_script(driver, "return document.querySelectorAll('#conversations li:not(.muted)').length === 1")
    driver.find_element("css selector", "#conversations li").click()
    wait_for_script(driver, "return !document.getElementById('conversation-detail').hidden")
    driver.find_element("id", "continue").click()


async def test_a_call_opens_in_the_conversation_chosen_before_connecting(stored, tmp_path, speech):
    http, pipeline, conversation_id = stored
    wav = write_clip(tmp_path / "mic.wav", [silence(1.5), speech[0], silence(20.0)])
    url = str(http.make_url("/"))

    def drive():
        driver = start_chromium(tmp_path, wav)
        try:
            driver.get(url)
            continue_stored(driver)
            driver.find_element("id", "connect").click()
            wait_for_script(driver, IN_SAVED)
            wait_for_script(
                driver, "return document.querySelectorAll('#transcript .turn.assistant[data-status]').length > 0"
            )
            return driver.execute_script("return session.conversationId")
        finally:
            driver.quit()

    assert await asyncio.to_thread(drive) == conversation_id
    history = pipeline.requests[0].history
    assert [h.role for h in history] == ["user", "assistant"] and history[1].text == "Earlier answer."
    turns = (await http.app[SERVER_CONTEXT].store.get_conversation(conversation_id))["turns"]
    assert [t["role"] for t in turns][:3] == ["user", "assistant", "user"]


async def test_a_live_call_moves_into_the_conversation_chosen(stored, tmp_path):
    http, _, conversation_id = stored
    url = str(http.make_url("/"))

    def drive():
        driver = start_chromium(tmp_path, None)
        try:
            driver.get(url)
            driver.find_element("id", "connect").click()
            wait_for_script(driver, "return document.body.dataset.state === 'listening'")
            before = driver.execute_script("return session.conversationId")
            continue_stored(driver)
            wait_for_script(driver, IN_SAVED)
            # The live call holds it now: deleting it is refused while the call lasts.
            delete = driver.execute_async_script(
                "const done = arguments[1]; fetch(arguments[0], {method: 'DELETE'}).then((r) => done(r.status));",
                f"/api/conversations/{conversation_id}",
            )
            return before, driver.execute_script("return session.conversationId"), delete
        finally:
            driver.quit()

    before, after, delete = await asyncio.to_thread(drive)
    assert before is None and after == conversation_id and delete == 409


async def test_connect_after_disconnect_continues_the_conversation_on_screen(stored, tmp_path, speech):
    http, _, _ = stored
    wav = write_clip(tmp_path / "mic.wav", [silence(1.5), speech[0], silence(40.0)])
    url = str(http.make_url("/"))

    def drive():
        driver = start_chromium(tmp_path, wav)
        try:
            driver.get(url)
            driver.find_element("id", "connect").click()
            wait_for_script(driver, IN_SAVED)  # the call's first turn made a new conversation
            first = driver.execute_script("return session.conversationId")
            driver.find_element("id", "connect").click()
            wait_for_script(driver, "return document.body.dataset.state === 'disconnected'")
            note = driver.find_element("id", "conversation-note").text
            driver.find_element("id", "connect").click()
            wait_for_script(driver, IN_SAVED)
            shown = len(driver.find_elements("css selector", "#transcript .turn"))
            return first, driver.execute_script("return session.conversationId"), note, shown
        finally:
            driver.quit()

    first, again, note, shown = await asyncio.to_thread(drive)
    assert first and again == first and note == "Press Connect to continue this conversation." and shown > 0
