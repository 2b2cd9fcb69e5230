"""The demo page at a phone's width, in headless Chromium against the real server (demo
weights): nothing makes it scroll sideways, neither the model's path in the header (a long
directory name, here the test's own) nor an unbroken run of characters in a stored turn and
the conversation's title (its first words), nor a voice with the longest name allowed in the
voice picker; and where the note on the call says its
conversation is listed, it is (below the call, not beside it)."""

import asyncio

from kimiaudio.server.context import SERVER_CONTEXT

from helpers.audio import silence, write_clip
from helpers.browser import BROWSER_MARKS, console_errors, page_in_chromium, wait_for_script
from helpers.voice_upload import form

pytestmark = BROWSER_MARKS

# What sticks out past the page's right edge, if anything.
WIDER = """
    const width = document.documentElement.clientWidth;
    return [...document.querySelectorAll('body *')]
        .filter((e) => e.getBoundingClientRect().right > width + 1)
        .map((e) => e.tagName.toLowerCase() + (e.id ? '#' + e.id : ''));"""


async def test_the_page_fits_a_phone_wide_window(demo_server, tmp_path):
    async with demo_server(tmp_path / "data" / "a-rather-long-directory-name-for-the-models") as (http, _):
        store = http.app[SERVER_CONTEXT].store
        conversation = await store.create_conversation()
        await store.add_turn(conversation["id"], "assistant", "Z" * 300)
        url = str(http.make_url("/"))

        def drive():
            with page_in_chromium(tmp_path, url, width=375) as driver:
                wait_for_script(driver, "return document.getElementById('model-info').textContent !== ''")
                wait_for_script(driver, "return document.querySelectorAll('#conversations li:not(.muted)').length")
                driver.find_element("css selector", "#conversations li").click()
                wait_for_script(driver, "return !document.getElementById('conversation-detail').hidden")
                sizes = driver.execute_script(
                    "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
                )
                return sizes, driver.execute_script(WIDER), console_errors(driver)

        (scroll_width, width), wider, errors = await asyncio.to_thread(drive)
    assert wider == [] and scroll_width == width <= 375
    assert errors == []


async def test_a_long_voice_name_does_not_widen_a_phone_wide_page(demo_server, tmp_path, espeak_voice):
    name = "V" * 64  # the longest voice name the server takes
    async with demo_server(tmp_path / "data") as (http, _):
        assert (await http.post("/api/voices", data=form(name, espeak_voice.read_bytes()))).status == 201
        url = str(http.make_url("/"))

        def drive():
            with page_in_chromium(tmp_path, url, width=320) as driver:
                wait_for_script(
                    driver, f"return [...document.getElementById('voice').options].some((o) => o.value === '{name}')"
                )
                driver.execute_script(f"document.getElementById('voice').value = '{name}'")
                sizes = driver.execute_script(
                    "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
                )
                return sizes, driver.execute_script(WIDER)

        (scroll_width, width), wider = await asyncio.to_thread(drive)
    assert wider == [] and scroll_width == width <= 320


async def test_the_note_on_a_saved_conversation_points_to_the_list_where_it_is(demo_server, tmp_path):
    # At a phone's width the list is below the call, not beside it.
    wav = write_clip(tmp_path / "mic.wav", [silence(60.0)])
    async with demo_server(tmp_path / "data") as (http, _):
        store = http.app[SERVER_CONTEXT].store
        saved = (await store.create_conversation("Saved"))["id"]
        url = str(http.make_url("/"))

        def drive():
            with page_in_chromium(tmp_path, url, wav, width=375) as driver:
                wait_for_script(driver, "return document.querySelectorAll('#conversations li:not(.muted)').length")
                driver.find_element("css selector", "#conversations li").click()
                wait_for_script(driver, "return !document.getElementById('conversation-detail').hidden")
                driver.find_element("id", "continue").click()
                driver.find_element("id", "connect").click()
                wait_for_script(driver, f"return session.conversationId === '{saved}'")
                talk, history = (
                    driver.find_element("id", part).rect for part in ("conversation-note", "conversations")
                )
                return driver.find_element("id", "conversation-note").text, talk["y"] < history["y"]

        note, list_below = await asyncio.to_thread(drive)
    assert list_below
    assert note == "Talking in a saved conversation; it is in the Conversations list."
