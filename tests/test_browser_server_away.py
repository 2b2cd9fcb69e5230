"""The demo page while its server is away, in headless Chromium (the real server, demo
weights, stopped under the page): what the person asks of the conversation list (open one,
delete one) says the server cannot be reached, instead of doing nothing."""

import asyncio

from kimiaudio.server.context import SERVER_CONTEXT

from helpers.browser import BROWSER_MARKS, start_chromium, wait_for_script

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
