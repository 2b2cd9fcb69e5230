"""The demo page at a phone's width, in headless Chromium against the real server (demo
weights): nothing makes it scroll sideways, neither the model's path in the header (a long
directory name, here the test's own) nor an unbroken run of characters in a stored turn and
the conversation's title (its first words)."""

import asyncio

from kimiaudio.server.context import SERVER_CONTEXT

from helpers.browser import BROWSER_MARKS, console_errors, start_chromium, wait_for_script

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
            driver = start_chromium(tmp_path, None)
            try:
                driver.set_window_size(375, 800)
                driver.get(url)
                wait_for_script(driver, "return document.getElementById('model-info').textContent !== ''")
                wait_for_script(driver, "return document.querySelectorAll('#conversations li:not(.muted)').length")
                driver.find_element("css selector", "#conversations li").click()
                wait_for_script(driver, "return !document.getElementById('conversation-detail').hidden")
                sizes = driver.execute_script(
                    "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
                )
                return sizes, driver.execute_script(WIDER), console_errors(driver)
            finally:
                driver.quit()

        (scroll_width, width), wider, errors = await asyncio.to_thread(drive)
    assert wider == [] and scroll_width == width <= 375
    assert errors == []
