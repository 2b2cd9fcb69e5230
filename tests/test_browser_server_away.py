"""The demo page while its server is away, in headless Chromium (the real server, demo
weights, stopped under the page): what the person asks of the conversation list (open one,
delete one, search it) says the server cannot be reached, instead of doing nothing; a page that loaded
while the server was away shows what it serves once Connect reaches it."""

import asyncio

from kimiaudio.server.context import SERVER_CONTEXT

from helpers.audio import silence, write_clip
from helpers.browser import BROWSER_MARKS, page_in_chromium, start_chromium, wait_for_script

pytestmark = BROWSER_MARKS

BANNER = "return !document.getElementById('error-banner').hidden && document.getElementById('error-banner').textContent"
LISTED = "document.querySelectorAll('#conversations li:not(.muted)')"
UNREACHABLE = "Cannot reach the kimiaudio server. Is `python -m kimiaudio serve` still running? Try again once it is."


async def test_opening_or_deleting_a_conversation_while_the_server_is_away_says_so(demo_server, tmp_path):
    driver = await asyncio.to_thread(start_chromium, tmp_path, None)
    try:
        async with demo_server(tmp_path / "data") as (http, _):
            store = http.app[SERVER_CONTEXT].store
            for title in ("First", "Second"):
                await store.create_conversation(title)
            url = str(http.make_url("/"))

            def shown():
                driver.get(url)
                driver.execute_script("window.confirm = () => true;")
                wait_for_script(
                    driver, "return document.querySelectorAll('#conversations li:not(.muted)').length === 2"
                )
                driver.find_element("xpath", "//ul[@id='conversations']/li[contains(., 'First')]").click()
                wait_for_script(driver, "return $('detail-title').textContent === 'First'")

            await asyncio.to_thread(shown)
        # The server is stopped: nothing answers at its address.

        def away():
            driver.find_element("id", "delete").click()
            deleting = wait_for_script(driver, BANNER)
            driver.find_element("xpath", "//ul[@id='conversations']/li[contains(., 'Second')]").click()
            return (
                deleting,
                wait_for_script(driver, BANNER),
                driver.execute_script("return $('detail-title').textContent"),
            )

        deleting, opening, title = await asyncio.to_thread(away)
    finally:
        await asyncio.to_thread(driver.quit)
    assert deleting == opening == UNREACHABLE
    assert title == "First"  # still the one shown


# The server away for the page's own requests (its HTML came): they fail as an unreachable
# server's do, until `serverAway` is cleared.
AWAY = """
window.serverAway = true;
const reachable = window.fetch;
window.fetch = (url, options) => window.serverAway && String(url).startsWith("/api/")
  ? Promise.reject(new TypeError("Failed to fetch")) : reachable(url, options);
"""


async def test_a_page_loaded_while_the_server_was_away_shows_it_once_connect_reaches_it(demo_server, tmp_path):
    wav = write_clip(tmp_path / "mic.wav", [silence(60.0)])
    driver = await asyncio.to_thread(start_chromium, tmp_path, wav)
    try:
        async with demo_server(tmp_path / "data") as (http, _):
            await http.app[SERVER_CONTEXT].store.create_conversation("Saved")
            url = str(http.make_url("/"))
            shown = "return [$('model-info').textContent, " + LISTED + ".length]"

            def drive():
                driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": AWAY})
                driver.get(url)
                away = wait_for_script(driver, BANNER), driver.execute_script(shown)
                driver.execute_script("window.serverAway = false;")
                driver.find_element("id", "connect").click()
                wait_for_script(driver, "return document.body.dataset.state === 'listening'")
                wait_for_script(driver, f"return {LISTED}.length === 1")
                return away, driver.execute_script(shown)

            (banner, before), after = await asyncio.to_thread(drive)
    finally:
        await asyncio.to_thread(driver.quit)
    assert banner.startswith("Cannot reach the kimiaudio server") and before == ["", 0]
    assert after[0].startswith("model: ") and after[1] == 1


async def test_a_search_while_the_server_is_away_says_so(demo_server, tmp_path):
    async with demo_server(tmp_path / "data") as (http, _):
        store = http.app[SERVER_CONTEXT].store
        for title in ("First", "Second"):
            await store.create_conversation(title)
        url = str(http.make_url("/"))

        def drive():
            with page_in_chromium(tmp_path, url) as driver:
                wait_for_script(driver, f"return {LISTED}.length === 2")
                # The server goes away; the requests refused are counted as they fail.
                driver.execute_script(
                    AWAY + "window.refused = 0; const away = window.fetch;"
                    "window.fetch = (url, options) => away(url, options).catch((e) => { refused++; throw e; });"
                )
                driver.execute_script("$('search').value = 'Second'; $('search').dispatchEvent(new Event('input'))")
                wait_for_script(driver, "return window.refused === 1")
                return driver.execute_script(BANNER)

        banner = await asyncio.to_thread(drive)
    # Not the last results (both conversations) under a search they do not answer, and no word.
    assert banner == UNREACHABLE
