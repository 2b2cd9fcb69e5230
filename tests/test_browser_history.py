"""The list of stored conversations on the demo page, in headless Chromium against the real
server (demo weights), where the server refuses what the page asked: a search it cannot run
says why in the list, in place of the last search's results, and the next search answers it;
a conversation deleted elsewhere (another tab) and then clicked is said to be deleted and
leaves the list, and opening another one answers that. Each listed conversation says how
many turns it has, and a keyboard alone opens one: Tab reaches it, Enter or Space opens it,
and the list filled anew keeps the focus on it; "Show older" pressed leaves it on the first
of the older ones shown. A conversation opened from the older ones
shown stays listed, marked as the one shown, and an answer in it moves it to the top while the
older ones loaded stay listed and the list stays scrolled where it was; they stay after a
delete too."""

import asyncio

from kimiaudio.server.context import SERVER_CONTEXT

from helpers.audio import silence, write_clip
from helpers.browser import (
    BROWSER_MARKS,
    console_errors,
    page_in_chromium,
    store_numbered_conversations,
    wait_for_script,
)

pytestmark = BROWSER_MARKS

# The conversations listed (not a note, nor the "Show older" item).
LISTED = "document.querySelectorAll('#conversations li:not(.muted):not(.more)')"
PAGE = f"""return {{
    listed: [...{LISTED}].map((li) => li.firstChild.textContent),
    note: [...document.querySelectorAll('#conversations li.muted')].map((li) => li.textContent),
    banner: document.getElementById('error-banner').hidden ? null : $('error-banner').textContent,
    shown: document.getElementById('conversation-detail').hidden ? null : $('detail-title').textContent,
}}"""


def search(driver, words: str) -> None:
    driver.execute_script("$('search').value = arguments[0]; $('search').dispatchEvent(new Event('input'))", words)


def open_the_oldest(driver, listed: int) -> None:
    """Show the older conversations (the list then holds `listed`) and open the oldest, on the
    second page: "Conversation 0." (store_numbered_conversations)."""
    wait_for_script(driver, "return document.querySelector('#conversations li.more')")
    driver.find_element("css selector", "#conversations li.more").click()
    wait_for_script(driver, f"return {LISTED}.length === {listed}")
    driver.execute_script(f"[...{LISTED}].pop().click()")
    wait_for_script(driver, "return $('detail-title').textContent === 'Conversation 0.'")


async def test_a_search_the_server_refuses_says_why_until_the_next_search(demo_server, tmp_path):
    async with demo_server(tmp_path / "data") as (http, _):
        store = http.app[SERVER_CONTEXT].store
        for topic in ("Lisbon", "bread"):  # (a conversation's title is its first words)
            conversation = await store.create_conversation()
            await store.add_turn(conversation["id"], "assistant", f"About {topic}.")
        url = str(http.make_url("/"))

        def drive():
            with page_in_chromium(tmp_path, url) as driver:
                wait_for_script(driver, f"return {LISTED}.length === 2")
                search(driver, "lisbon")
                wait_for_script(driver, f"return {LISTED}.length === 1")
                search(driver, "lisbon " + "x" * 300)  # over the server's 200 characters
                # (the server's 400 reaches the page either in the list or in the banner)
                wait_for_script(
                    driver,
                    "return document.querySelector('#conversations li.muted') !== null"
                    " || !document.getElementById('error-banner').hidden",
                )
                refused = driver.execute_script(PAGE)
                search(driver, "bread")
                bread = "[...LISTED].map((li) => li.firstChild.textContent).join() === 'About bread.'"
                wait_for_script(driver, "return " + bread.replace("LISTED", LISTED))
                return refused, driver.execute_script(PAGE), console_errors(driver)

        refused, after, errors = await asyncio.to_thread(drive)
    # The refusal stands where the results were: none of the last search's stay listed.
    assert refused["listed"] == [] and refused["banner"] is None
    assert refused["note"] == ["This search cannot be run (q: at most 200 characters, got 307)."]
    assert after == {"listed": ["About bread."], "note": [], "banner": None, "shown": None}
    assert all("/api/conversations?q=" in e for e in errors)  # only the refused request's own 400


async def test_a_conversation_deleted_in_another_tab_is_said_gone_when_clicked(demo_server, tmp_path):
    async with demo_server(tmp_path / "data") as (http, _):
        store = http.app[SERVER_CONTEXT].store
        await store.create_conversation("Kept")
        gone = (await store.create_conversation("Gone"))["id"]
        url = str(http.make_url("/"))

        def drive():
            with page_in_chromium(tmp_path, url) as driver:
                wait_for_script(driver, f"return {LISTED}.length === 2")
                # Another tab deletes it: the list here still shows it.
                status = driver.execute_async_script(
                    "fetch(`/api/conversations/${arguments[0]}`, { method: 'DELETE' })"
                    ".then((r) => arguments[1](r.status))",
                    gone,
                )
                driver.find_element("xpath", "//ul[@id='conversations']/li[contains(., 'Gone')]").click()
                wait_for_script(driver, "return !document.getElementById('error-banner').hidden")
                said = driver.find_element("id", "error-banner").text
                if said == "That conversation was deleted.":  # (else the list is not refreshed)
                    wait_for_script(driver, f"return {LISTED}.length === 1")
                clicked = driver.execute_script(PAGE)
                driver.find_element("xpath", "//ul[@id='conversations']/li[contains(., 'Kept')]").click()
                wait_for_script(driver, "return $('detail-title').textContent === 'Kept'")
                return status, clicked, driver.execute_script(PAGE)

        status, clicked, other = await asyncio.to_thread(drive)
    assert status == 200
    assert clicked == {"listed": ["Kept"], "note": [], "banner": "That conversation was deleted.", "shown": None}
    assert other == {"listed": ["Kept"], "note": [], "banner": None, "shown": "Kept"}


async def test_the_list_counts_each_conversations_turns(demo_server, tmp_path):
    async with demo_server(tmp_path / "data") as (http, _):
        store = http.app[SERVER_CONTEXT].store
        for count in (1, 2):
            conversation = await store.create_conversation(f"{count} said")
            for _ in range(count):
                await store.add_turn(conversation["id"], "assistant", "Said.")
        url = str(http.make_url("/"))

        def drive():
            with page_in_chromium(tmp_path, url) as driver:
                wait_for_script(driver, f"return {LISTED}.length === 2")
                return driver.execute_script(
                    f"return [...{LISTED}].map((li) => li.querySelector('.when').textContent.split(' · ')[1])"
                )

        counts = await asyncio.to_thread(drive)
    assert sorted(counts) == ["1 turn", "2 turns"]


async def test_the_keyboard_alone_opens_the_conversations_listed(demo_server, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    async with demo_server(tmp_path / "data") as (http, _):
        store = http.app[SERVER_CONTEXT].store
        for said in ("Older.", "Newer."):  # (a conversation's title is its first words)
            await store.add_turn((await store.create_conversation())["id"], "assistant", said)
        url = str(http.make_url("/"))
        focused = "return document.activeElement.firstChild && document.activeElement.firstChild.textContent"

        def drive():
            with page_in_chromium(tmp_path, url) as driver:
                wait_for_script(driver, f"return {LISTED}.length === 2")
                driver.find_element("id", "search").click()
                keys = ActionChains(driver)
                keys.send_keys(Keys.TAB).perform()  # from the search box to the newest conversation
                reached = driver.execute_script(focused)
                keys.send_keys(Keys.ENTER).perform()
                wait_for_script(driver, "return $('detail-title').textContent === 'Newer.'")
                # The list filled anew (as after each answer of a call): the focus stays on it.
                driver.execute_script(f"{LISTED}.forEach((li) => {{ li.dataset.before = 'yes'; }})")
                driver.execute_script("refreshConversations()")
                wait_for_script(
                    driver,
                    f"return ![...{LISTED}].some((li) => li.dataset.before) && "
                    "document.activeElement.closest('#conversations')",
                )
                on_it = driver.execute_script(focused)
                keys.send_keys(Keys.TAB, " ").perform()  # the next Tab goes on to the next one
                wait_for_script(driver, "return $('detail-title').textContent === 'Older.'")
                return reached, on_it, driver.execute_script(focused), console_errors(driver)

        reached, on_it, last, errors = await asyncio.to_thread(drive)
    assert reached == on_it == "Newer." and last == "Older." and errors == []


async def test_a_conversation_opened_from_the_older_ones_stays_listed(demo_server, tmp_path):
    async with demo_server(tmp_path / "data") as (http, _):
        store = http.app[SERVER_CONTEXT].store
        await store_numbered_conversations(store, 101)
        url = str(http.make_url("/"))

        def drive():
            with page_in_chromium(tmp_path, url) as driver:
                open_the_oldest(driver, 101)
                wait_for_script(driver, "return document.querySelector('#conversations li.selected')")
                selected = driver.execute_script(
                    "return [...document.querySelectorAll('#conversations li.selected')]"
                    ".map((li) => li.firstChild.textContent)"
                )
                return selected, driver.execute_script(f"return {LISTED}.length"), console_errors(driver)

        selected, listed, errors = await asyncio.to_thread(drive)
    assert selected == ["Conversation 0."] and listed == 101 and errors == []


async def test_an_answer_keeps_the_older_conversations_loaded_and_the_scroll(demo_server, tmp_path, speech):
    wav = write_clip(tmp_path / "mic.wav", [silence(1.5), speech[0], silence(30.0)])
    async with demo_server(tmp_path / "data") as (http, _):
        store = http.app[SERVER_CONTEXT].store
        await store_numbered_conversations(store, 101)
        url = str(http.make_url("/"))

        def drive():
            with page_in_chromium(tmp_path, url, wav) as driver:
                open_the_oldest(driver, 101)  # continued: its answer moves it to the top
                driver.find_element("id", "continue").click()
                driver.execute_script("$('conversations').scrollTop = 2000")
                scrolled = driver.execute_script("return $('conversations').scrollTop")
                driver.find_element("id", "connect").click()
                wait_for_script(driver, "return document.querySelector('#transcript .turn.assistant[data-status]')")
                # The list filled after the answer: the conversation continued is on top, with its turns.
                wait_for_script(
                    driver,
                    f"const top = {LISTED}[0];"
                    "return top.firstChild.textContent === 'Conversation 0.' && top.textContent.includes('3 turns')",
                )
                return (
                    scrolled,
                    driver.execute_script(f"return [...{LISTED}].map((li) => li.firstChild.textContent)"),
                    driver.execute_script("return $('conversations').scrollTop"),
                    console_errors(driver),
                )

        scrolled, listed, scroll, errors = await asyncio.to_thread(drive)
    assert listed == ["Conversation 0."] + [f"Conversation {n}." for n in range(100, 0, -1)]
    assert scrolled > 0 and scroll == scrolled and errors == []


async def test_a_delete_keeps_the_older_conversations_loaded(demo_server, tmp_path):
    async with demo_server(tmp_path / "data") as (http, _):
        store = http.app[SERVER_CONTEXT].store
        await store_numbered_conversations(store, 102)
        url = str(http.make_url("/"))

        def drive():
            with page_in_chromium(tmp_path, url) as driver:
                driver.execute_script("window.confirm = () => true;")
                open_the_oldest(driver, 102)
                driver.execute_script(f"{LISTED}.forEach((li) => {{ li.dataset.before = 'yes'; }})")
                driver.find_element("id", "delete").click()
                wait_for_script(driver, f"return !{LISTED}[0].dataset.before")  # the list filled anew
                listed = driver.execute_script(f"return [...{LISTED}].map((li) => li.firstChild.textContent)")
                return listed, console_errors(driver)

        listed, errors = await asyncio.to_thread(drive)
    assert listed == [f"Conversation {n}." for n in range(101, 0, -1)] and errors == []


async def test_show_older_pressed_with_the_keyboard_leaves_the_focus_in_the_list(demo_server, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    async with demo_server(tmp_path / "data") as (http, _):
        store = http.app[SERVER_CONTEXT].store
        await store_numbered_conversations(store, 101)
        url = str(http.make_url("/"))

        def drive():
            with page_in_chromium(tmp_path, url) as driver:
                wait_for_script(driver, "return document.querySelector('#conversations li.more')")
                driver.execute_script("document.querySelector('#conversations li.more').focus()")
                ActionChains(driver).send_keys(Keys.ENTER).perform()
                wait_for_script(driver, f"return {LISTED}.length === 101")
                return driver.execute_script(
                    "const f = document.activeElement; return f.dataset.id ? f.firstChild.textContent : f.tagName"
                )

        focused = await asyncio.to_thread(drive)
    assert focused == "Conversation 0."  # the first of the page shown
