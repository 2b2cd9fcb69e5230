"""The demo page's Connect when the server does not answer, in headless Chromium against the
real server (demo weights): an offer whose answer never comes. After a time limit (shortened
here; the page's CALL_LIMITS) the page says that the server does not answer and is usable again:
Connect makes a call. An answer that comes after all is for a call given up: the page hangs it
up, and the server frees its slot at once."""

import asyncio
import logging

from kimiaudio.server.context import SERVER_CONTEXT

from helpers.browser import BROWSER_MARKS, HOLD_CALL_ANSWERS, close_reasons, start_chromium, wait_for_script
from helpers.waiting import eventually

pytestmark = BROWSER_MARKS

PAGE = """return {
    state: document.body.dataset.state,
    banner: document.getElementById('error-banner').hidden ? null : document.getElementById('error-banner').textContent,
    button: [document.getElementById('connect').textContent, document.getElementById('connect').disabled],
}"""


async def test_connect_without_an_answer_gives_up_and_connects_again(demo_server, tmp_path, caplog):
    caplog.set_level(logging.INFO, "kimiaudio.server.transport.rtc_peer")
    async with demo_server(tmp_path / "data") as (http, _):
        sessions = http.app[SERVER_CONTEXT].sessions
        url = str(http.make_url("/"))
        driver = await asyncio.to_thread(start_chromium, tmp_path, None)

        def no_answer():
            driver.get(url)
            # The limit also runs over the key and the offer's ICE gathering, which a loaded
            # machine may take a second or more for: the call must be sent (and held) first.
            driver.execute_script(HOLD_CALL_ANSWERS + "CALL_LIMITS.answerMs = 5000;")
            driver.find_element("id", "connect").click()
            wait_for_script(driver, "return held.length === 1 && document.body.dataset.state === 'disconnected'")
            return driver.execute_script(PAGE)

        def connect_again():
            # The answer held comes late, for the call given up; the next Connect is answered.
            driver.execute_script("CALL_LIMITS.answerMs = 120000; fetch = realFetch; held[0].deliver();")
            driver.find_element("id", "connect").click()
            wait_for_script(driver, "return document.body.dataset.state === 'listening'")
            return driver.execute_script(PAGE)

        try:
            given_up = await asyncio.to_thread(no_answer)
            again = await asyncio.to_thread(connect_again)
            reasons = await eventually(lambda: asyncio.sleep(0, close_reasons(caplog.records)), "the late call closed")
            in_use = sessions.num_reserved
        finally:
            await asyncio.to_thread(driver.quit)
    assert given_up == {
        "state": "disconnected",
        "banner": "The server does not answer. Is it overloaded or stopped? Press Connect to try again.",
        "button": ["Connect", False],
    }
    assert again == {"state": "listening", "banner": None, "button": ["Disconnect", False]}
    # The late call was hung up, not left to time out; the new one goes on.
    assert reasons == ["the client hung up"] and in_use == 1
