"""The demo page continues a stored conversation, in headless Chromium against the real server and
pipeline (demo weights): chosen before connecting, the call opens in it (?conversation_id= on
/v1/realtime/calls) and what is said next is answered with its history and stored in it;
chosen while connected, conversation.select moves the live call into it. Either way the server
says which conversation the call is in, and the page shows it. One the server refuses (open in
another session, or deleted meanwhile) is one sentence, and the page stays usable."""

import asyncio
import math
import re

import pytest

from kimiaudio.bench.loopback_client import RtcClient, ScriptedMic
from kimiaudio.server.context import SERVER_CONTEXT

from helpers.audio import silence, write_clip
from helpers.browser import BROWSER_MARKS, start_chromium, wait_for_script
from helpers.demo_server import lease_free
from helpers.waiting import eventually

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


def continue_stored_shown(driver) -> None:
    """Click the stored conversation in the list: its turns are shown."""
    wait_for_script(driver, "return document.querySelectorAll('#conversations li:not(.muted)').length === 1")
    driver.find_element("css selector", "#conversations li").click()
    wait_for_script(driver, "return !document.getElementById('conversation-detail').hidden")


def continue_stored(driver) -> None:
    continue_stored_shown(driver)
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


async def test_continue_of_the_conversation_already_on_screen_keeps_its_turns(stored, tmp_path, speech):
    http, _, conversation_id = stored
    wav = write_clip(tmp_path / "mic.wav", [silence(1.5), speech[0], silence(40.0)])
    url = str(http.make_url("/"))
    turns = "return document.querySelectorAll('#transcript .turn').length"

    def drive():
        driver = start_chromium(tmp_path, wav)
        try:
            driver.get(url)
            continue_stored(driver)
            driver.find_element("id", "connect").click()
            wait_for_script(driver, "return document.querySelector('#transcript .turn.assistant[data-status]')")
            # What the page sends the live call from now on.
            driver.execute_script("""window.sent = [];
                const channel = session.channel, send = channel.send.bind(channel);
                channel.send = (data) => { sent.push(JSON.parse(data).type); send(data); };""")
            shown = driver.execute_script(turns)
            driver.find_element("id", "continue").click()  # (the conversation is still the one shown)
            live = driver.execute_script("return [sent, session.selecting]"), driver.execute_script(turns)
            driver.find_element("id", "connect").click()
            wait_for_script(driver, "return document.body.dataset.state === 'disconnected'")
            driver.find_element("id", "continue").click()  # the one the next Connect continues
            return shown, live, driver.execute_script(turns), driver.execute_script("return session.continueId")
        finally:
            driver.quit()

    shown, ((sent, selecting), live_turns), after_turns, next_id = await asyncio.to_thread(drive)
    assert shown >= 2 and sent == [] and selecting is None and live_turns == after_turns == shown
    assert next_id == conversation_id


REFUSED = """
    const banner = document.getElementById('error-banner');
    return !banner.hidden && document.body.dataset.state !== 'connecting' && banner.textContent;"""
PAGE = """return {
    state: document.body.dataset.state,
    note: document.getElementById('conversation-note').textContent,
    detailShown: !document.getElementById('conversation-detail').hidden,
    ids: [session.conversationId, session.continueId, selectedId],
}"""


def show_stored_and_continue(driver, connected: bool) -> None:
    """Continue the stored conversation, from a live call or for the next Connect."""
    if connected:
        driver.find_element("id", "connect").click()
        wait_for_script(driver, "return document.body.dataset.state === 'listening'")
    driver.find_element("id", "continue").click()
    if not connected:
        driver.find_element("id", "connect").click()


@pytest.mark.parametrize("connected", [False, True], ids=["on-connect", "live-call"])
async def test_continue_of_a_conversation_open_elsewhere_says_so_and_works_once_it_is_free(stored, tmp_path, connected):
    http, _, conversation_id = stored
    store = http.app[SERVER_CONTEXT].store
    url = str(http.make_url("/"))
    driver = await asyncio.to_thread(start_chromium, tmp_path, None)

    def refused():
        show_stored_and_continue(driver, connected)
        return wait_for_script(driver, REFUSED), driver.execute_script(PAGE)

    def continued():
        driver.find_element("id", "connect" if not connected else "continue").click()
        wait_for_script(driver, IN_SAVED)
        return driver.execute_script("return session.conversationId")

    holder = RtcClient(ScriptedMic())  # another tab, say
    try:
        await asyncio.to_thread(lambda: driver.get(url) or continue_stored_shown(driver))
        assert (await holder.connect(http, conversation_id=conversation_id))[0] == 201
        banner, page = await asyncio.to_thread(refused)
        await holder.close()
        await eventually(lambda: lease_free(store, conversation_id), "the other session's lease released")
        again = await asyncio.to_thread(continued)
    finally:
        await asyncio.to_thread(driver.quit)
        await holder.close()
    busy, retry = banner.split(", or ")
    assert busy == "That conversation is open in another tab or session: close it there"
    if connected:
        assert retry == "try again in a few seconds."
    else:  # the seconds the other session's hold had left when Connect asked (Retry-After)
        said = re.fullmatch(r"try again in (\d+) seconds?\.", retry)
        assert said and 1 <= int(said[1]) <= math.ceil(store.lease_seconds), retry
    if connected:  # the call stays as it was, in a new conversation
        assert (page["state"], page["ids"]) == ("listening", [None, None, conversation_id])
    else:  # Connect asks for it again
        assert (page["state"], page["ids"]) == ("disconnected", [None, conversation_id, conversation_id])
    assert again == conversation_id


@pytest.mark.parametrize("connected", [False, True], ids=["on-connect", "live-call"])
async def test_continue_of_a_deleted_conversation_says_so_and_forgets_it(stored, tmp_path, connected):
    http, _, conversation_id = stored
    store = http.app[SERVER_CONTEXT].store
    url = str(http.make_url("/"))
    driver = await asyncio.to_thread(start_chromium, tmp_path, None)

    def refused():
        show_stored_and_continue(driver, connected)
        banner = wait_for_script(driver, REFUSED)
        wait_for_script(driver, "return document.querySelector('#conversations li.muted') !== null")
        return banner, driver.execute_script(PAGE)

    def connect_again():
        if not connected:
            driver.find_element("id", "connect").click()
        wait_for_script(driver, "return document.body.dataset.state === 'listening'")
        return driver.execute_script("return [session.callId, session.conversationId]")

    try:
        await asyncio.to_thread(lambda: driver.get(url) or continue_stored_shown(driver))
        await store.delete_conversation(conversation_id)  # from another tab, say
        banner, page = await asyncio.to_thread(refused)
        call_id, in_conversation = await asyncio.to_thread(connect_again)
    finally:
        await asyncio.to_thread(driver.quit)
    assert banner == "That conversation was deleted."
    assert page == {
        "state": "listening" if connected else "disconnected",
        "note": "A new conversation starts when you speak.",
        "detailShown": False,
        "ids": [None, None, None],
    }
    assert call_id and in_conversation is None  # the next Connect starts a new conversation


async def test_new_right_after_continue_on_a_live_call_is_what_the_next_connect_opens(stored, tmp_path):
    """Continue, then New before the server has answered the first: the call ends up in a new
    conversation, and after a Disconnect, Connect does not take the one given up back."""
    http, _, conversation_id = stored
    url = str(http.make_url("/"))
    moves = f"""return moves.join() === '{conversation_id},'"""

    def drive():
        driver = start_chromium(tmp_path, None)
        try:
            driver.get(url)
            driver.find_element("id", "connect").click()
            wait_for_script(driver, "return session.channel && session.channel.readyState === 'open'")
            continue_stored_shown(driver)
            driver.execute_script(
                "window.moves = []; session.channel.addEventListener('message', (e) => {"
                "  const event = JSON.parse(e.data);"
                "  if (event.type === 'session.updated' && moves.length < 2) moves.push(event.session.conversation_id);"
                "});"
                "document.getElementById('continue').click(); document.getElementById('new-conversation').click();"
            )
            wait_for_script(driver, moves)  # moved in, then out to a new one
            driver.find_element("id", "connect").click()
            wait_for_script(driver, "return document.body.dataset.state === 'disconnected'")
            return driver.execute_script(
                "return [session.continueId, document.getElementById('conversation-note').textContent]"
            )
        finally:
            driver.quit()

    continue_id, note = await asyncio.to_thread(drive)
    assert continue_id is None and note == "A new conversation starts when you speak."


async def test_a_refused_continue_says_so_until_the_next_choice_succeeds(stored, tmp_path):
    """On a live call, Continue of a conversation deleted meanwhile is refused; Continue of
    another then moves the call, and the refusal's banner no longer stands over it."""
    http, _, conversation_id = stored
    store = http.app[SERVER_CONTEXT].store
    gone = (await store.create_conversation("Gone"))["id"]
    url = str(http.make_url("/"))
    driver = await asyncio.to_thread(start_chromium, tmp_path, None)

    def show(title, listed):
        listed_now = f"document.querySelectorAll('#conversations li:not(.muted)').length === {listed}"
        wait_for_script(driver, f"return {listed_now}")
        driver.find_element("xpath", f"//ul[@id='conversations']/li[contains(., '{title}')]").click()
        wait_for_script(driver, f"return document.getElementById('detail-title').textContent === '{title}'")

    def refused():
        driver.find_element("id", "connect").click()
        wait_for_script(driver, "return document.body.dataset.state === 'listening'")
        driver.find_element("id", "continue").click()
        return wait_for_script(driver, REFUSED)

    def continued():
        show("Earlier answer.", 1)  # "Gone" has left the list
        driver.find_element("id", "continue").click()
        wait_for_script(driver, IN_SAVED)
        return driver.execute_script("return [session.conversationId, document.getElementById('error-banner').hidden]")

    try:
        await asyncio.to_thread(lambda: driver.get(url) or show("Gone", 2))
        await store.delete_conversation(gone)
        banner = await asyncio.to_thread(refused)
        moved, banner_hidden = await asyncio.to_thread(continued)
    finally:
        await asyncio.to_thread(driver.quit)
    assert banner == "That conversation was deleted."
    assert moved == conversation_id and banner_hidden
