"""Deleting a stored conversation on the demo page, in headless Chromium against the real server
(demo weights): the conversation deleted is forgotten (the list, the panel, the next Connect,
the turns of its last call still on screen), and only that one: another clicked and continued
before the server answered the delete stays shown and is what the next Connect continues. The
conversation of the page's own live call is not deleted: the page says to hang up first (the
server would refuse it as held by a session, as if another tab had it open); for one another
tab's call holds, it says to close it there. Once one is deleted, the focus on the Delete
control goes to the conversation listed after it (before it, when it was the last), or to New
when none is left."""

import asyncio

from kimiaudio.bench.loopback_client import RtcClient, ScriptedMic
from kimiaudio.server.context import SERVER_CONTEXT

from helpers.audio import silence, write_clip
from helpers.browser import BROWSER_MARKS, hold_answers, page_in_chromium, start_chromium, wait_for_script
from helpers.demo_server import lease_free
from helpers.waiting import eventually

pytestmark = BROWSER_MARKS

LISTED = "document.querySelectorAll('#conversations li:not(.muted)')"
PAGE = f"""return {{
    listed: [...{LISTED}].map((li) => li.firstChild.textContent),
    shown: document.getElementById('conversation-detail').hidden ? null : $('detail-title').textContent,
    ids: [session.continueId, selectedId],
    note: document.getElementById('conversation-note').textContent,
}}"""


def click_conversation(driver, title: str) -> None:
    driver.find_element("xpath", f"//ul[@id='conversations']/li[contains(., '{title}')]").click()
    wait_for_script(driver, f"return document.getElementById('detail-title').textContent === '{title}'")


async def test_a_conversation_clicked_while_another_is_deleted_stays(demo_server, tmp_path):
    async with demo_server(tmp_path / "data") as (http, _):
        store = http.app[SERVER_CONTEXT].store
        kept = (await store.create_conversation("Kept"))["id"]
        deleted = (await store.create_conversation("Deleted"))["id"]
        url = str(http.make_url("/"))

        def drive():
            with page_in_chromium(tmp_path, url) as driver:
                driver.execute_script("window.confirm = () => true;")
                wait_for_script(driver, f"return {LISTED}.length === 2")
                click_conversation(driver, "Deleted")
                driver.execute_script(hold_answers("options && options.method === 'DELETE'"))
                driver.find_element("id", "delete").click()
                wait_for_script(driver, "return held.length === 1")
                click_conversation(driver, "Kept")
                driver.find_element("id", "continue").click()
                driver.execute_script("held[0].deliver()")
                wait_for_script(driver, f"return {LISTED}.length === 1")
                return driver.execute_script(PAGE)

        page = await asyncio.to_thread(drive)
        assert await store.get_conversation(deleted) is None
    assert page == {
        "listed": ["Kept"],
        "shown": "Kept",
        "ids": [kept, kept],
        "note": "Press Connect to continue the selected conversation.",
    }


async def test_delete_of_the_live_calls_conversation_says_to_hang_up_first(demo_server, tmp_path):
    wav = write_clip(tmp_path / "mic.wav", [silence(60.0)])
    async with demo_server(tmp_path / "data") as (http, _):
        store = http.app[SERVER_CONTEXT].store
        live = (await store.create_conversation("Live"))["id"]
        url = str(http.make_url("/"))

        def drive():
            with page_in_chromium(tmp_path, url, wav) as driver:
                driver.execute_script("window.confirm = () => true;")
                wait_for_script(driver, f"return {LISTED}.length === 1")
                click_conversation(driver, "Live")
                driver.find_element("id", "continue").click()
                driver.find_element("id", "connect").click()
                wait_for_script(driver, f"return session.pc && session.conversationId === '{live}'")
                driver.find_element("id", "delete").click()
                wait_for_script(driver, "return !document.getElementById('error-banner').hidden")
                return driver.find_element("id", "error-banner").text, driver.execute_script(PAGE)

        said, page = await asyncio.to_thread(drive)
        assert await store.get_conversation(live) is not None
    assert said == "This conversation is in the call on this page: press Disconnect, then Delete."
    assert page["listed"] == ["Live"] and page["shown"] == "Live"


async def test_deleting_the_conversation_on_screen_clears_its_turns(demo_server, tmp_path, speech):
    wav = write_clip(tmp_path / "mic.wav", [silence(1.0), speech[0], silence(60.0)])
    async with demo_server(tmp_path / "data") as (http, _):
        store = http.app[SERVER_CONTEXT].store
        url = str(http.make_url("/"))
        loop = asyncio.get_running_loop()

        def drive():
            with page_in_chromium(tmp_path, url, wav) as driver:
                driver.execute_script("window.confirm = () => true;")
                driver.find_element("id", "connect").click()
                wait_for_script(driver, "return document.querySelector('#transcript .turn.user') !== null")
                wait_for_script(driver, f"return session.conversationId && {LISTED}.length === 1")
                call = driver.execute_script("return session.conversationId")
                driver.find_element("id", "connect").click()  # hang up: the server lets it go
                asyncio.run_coroutine_threadsafe(
                    eventually(lambda: lease_free(store, call), "the call's conversation let go"), loop
                ).result()
                driver.find_element("css selector", "#conversations li").click()
                wait_for_script(driver, "return !document.getElementById('conversation-detail').hidden")
                turns_before = len(driver.find_elements("css selector", "#transcript .turn"))
                driver.find_element("id", "delete").click()
                wait_for_script(driver, f"return {LISTED}.length === 0 && session.continueId === null")
                return (
                    turns_before,
                    len(driver.find_elements("css selector", "#transcript .turn")),
                    driver.execute_script(PAGE),
                )

        before, after, page = await asyncio.to_thread(drive)
        assert await store.list_conversations() == []
    assert before > 0 and after == 0
    assert page["note"] == "A new conversation starts when you speak." and page["shown"] is None


async def test_delete_of_a_conversation_open_elsewhere_says_to_close_it_there(demo_server, tmp_path):
    async with demo_server(tmp_path / "data") as (http, _):
        store = http.app[SERVER_CONTEXT].store
        held = (await store.create_conversation("Held"))["id"]
        url = str(http.make_url("/"))
        driver = await asyncio.to_thread(start_chromium, tmp_path, None)

        def delete():
            driver.find_element("id", "delete").click()
            wait_for_script(driver, "return !document.getElementById('error-banner').hidden")
            return driver.find_element("id", "error-banner").text, driver.execute_script(PAGE)

        holder = RtcClient(ScriptedMic())  # another tab's call, say
        try:
            await asyncio.to_thread(lambda: driver.get(url) or driver.execute_script("window.confirm = () => true;"))
            await asyncio.to_thread(lambda: wait_for_script(driver, f"return {LISTED}.length === 1"))
            await asyncio.to_thread(click_conversation, driver, "Held")
            assert (await holder.connect(http, conversation_id=held))[0] == 201
            said, page = await asyncio.to_thread(delete)
        finally:
            await asyncio.to_thread(driver.quit)
            await holder.close()
        assert await store.get_conversation(held) is not None
    # Not the server's "try again in N s": its hold is renewed for as long as that call lasts.
    assert said == "That conversation is open in another tab or session: close it there, then delete it."
    assert page["listed"] == ["Held"] and page["shown"] == "Held"


async def test_the_focus_moves_to_a_conversation_listed_once_one_is_deleted(demo_server, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    async with demo_server(tmp_path / "data") as (http, _):
        store = http.app[SERVER_CONTEXT].store
        for said in ("Oldest.", "Middle.", "Newest."):  # (a conversation's title is its first words)
            await store.add_turn((await store.create_conversation())["id"], "assistant", said)
        url = str(http.make_url("/"))
        focused = "const f = document.activeElement; return f.dataset.id ? f.firstChild.textContent : f.id || f.tagName"

        def delete_by_keyboard(driver, left: int) -> str:
            """Delete (confirmed) pressed with Enter; -> where the focus is once the list is filled anew."""
            driver.execute_script(f"{LISTED}.forEach((li) => {{ li.dataset.before = 'yes'; }})")
            driver.execute_script("$('delete').focus()")
            ActionChains(driver).send_keys(Keys.ENTER).perform()
            refilled = f"![...{LISTED}].some((li) => li.dataset.before)"
            wait_for_script(driver, f"return {LISTED}.length === {left} && {refilled} && $('conversations').firstChild")
            return driver.execute_script(focused)

        def drive():
            with page_in_chromium(tmp_path, url) as driver:
                driver.execute_script("window.confirm = () => true;")
                wait_for_script(driver, f"return {LISTED}.length === 3")
                click_conversation(driver, "Middle.")
                after_middle = delete_by_keyboard(driver, 2)  # the one listed after it
                click_conversation(driver, "Oldest.")
                after_last = delete_by_keyboard(driver, 1)  # the last listed: the one before it
                click_conversation(driver, "Newest.")
                after_all = delete_by_keyboard(driver, 0)  # none left
                return after_middle, after_last, after_all

        where = await asyncio.to_thread(drive)
    assert where == ("Oldest.", "Newest.", "new-conversation")
