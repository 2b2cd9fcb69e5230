"""The demo page against a server with an API key, in headless Chromium: it asks for the key,
refuses a wrong one, and with the right one lists and replays the stored conversations and
connects (the key goes with every request: Bearer for fetch, ?api_key= for <audio>)."""

import asyncio

import numpy as np
import pytest

from kimiaudio.server.context import SERVER_CONTEXT
from kimiaudio.server.middleware.access import API_KEY_ENV

from helpers.browser import BROWSER_MARKS, start_chromium, wait_for_script

pytestmark = BROWSER_MARKS
KEY = "page-test-key-42"


@pytest.fixture
async def server(tmp_path, monkeypatch, demo_server):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    async with demo_server(tmp_path / "data", api_key=KEY) as (client, _):
        yield client


async def test_page_asks_for_the_key_and_sends_it(server, tmp_path):
    store = server.app[SERVER_CONTEXT].store
    conversation = await store.create_conversation("Stored earlier")
    await store.add_turn(conversation["id"], "user", audio=np.full(8000, 0.1, np.float32))
    url = str(server.make_url("/"))

    def drive():
        driver = start_chromium(tmp_path, None)
        try:
            driver.get(url)
            wait_for_script(driver, "return !document.getElementById('login').hidden")
            listed_before = len(driver.find_elements("css selector", "#conversations li"))
            field = driver.find_element("id", "api-key")
            field.send_keys("wrong-key")
            driver.find_element("css selector", "#login button").click()
            refused = wait_for_script(
                driver,
                "return document.getElementById('login-message').textContent.includes('not "
                "accepted') && document.getElementById('login-message').textContent",
            )
            field.clear()
            field.send_keys(KEY)
            driver.find_element("css selector", "#login button").click()
            wait_for_script(driver, "return document.getElementById('login').hidden")
            wait_for_script(driver, "return document.querySelectorAll('#conversations li:not(.muted)').length === 1")
            driver.find_element("css selector", "#conversations li").click()
            src = wait_for_script(driver, "const a = document.querySelector('#detail-turns audio'); return a && a.src")
            audio_status = driver.execute_async_script(
                "const done = arguments[1]; fetch(arguments[0]).then((r) => done(r.status));", src
            )
            driver.find_element("id", "connect").click()
            wait_for_script(driver, "return document.body.dataset.state === 'listening'")
            return {
                "listed_before": listed_before,
                "refused": refused,
                "src": src,
                "audio_status": audio_status,
                "error_hidden": driver.execute_script("return document.getElementById('error-banner').hidden"),
            }
        finally:
            driver.quit()

    result = await asyncio.to_thread(drive)
    assert result["listed_before"] == 0  # nothing was shown before the key was given
    assert "not accepted" in result["refused"]
    assert f"api_key={KEY}" in result["src"] and result["audio_status"] == 200
    assert result["error_hidden"]
