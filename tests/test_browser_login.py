"""The demo page against a server with an API key, in headless Chromium: it asks for the key,
refuses a wrong one, and with the right one signs in, lists and replays the stored
conversations and calls the server as OpenAI's browser examples do (an ephemeral key from its
backend, the SDP offer to /v1/realtime/calls). The key itself is kept nowhere a script or a
URL could show it: what the browser keeps is an HttpOnly sign-in cookie."""

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


async def test_page_signs_in_without_keeping_the_key(server, tmp_path):
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
            call_id = driver.execute_script("return session.callId")
            # Where a script could find the key: storage, cookies, the page itself.
            visible = driver.execute_script(
                "return [JSON.stringify(sessionStorage), JSON.stringify(localStorage), document.cookie, "
                "document.documentElement.outerHTML].join(' ')"
            )
            reloaded = driver.get(url) or wait_for_script(
                driver, "return document.querySelectorAll('#conversations li:not(.muted)').length === 1"
            )
            driver.find_element("id", "signout").click()
            signed_out = wait_for_script(driver, "return !document.getElementById('login').hidden")
            return {
                "listed_before": listed_before,
                "refused": refused,
                "src": src,
                "audio_status": audio_status,
                "call_id": call_id,
                "visible": visible,
                "reloaded": reloaded,
                "signed_out": signed_out,
                "error_hidden": driver.execute_script("return document.getElementById('error-banner').hidden"),
            }
        finally:
            driver.quit()

    result = await asyncio.to_thread(drive)
    assert result["listed_before"] == 0  # nothing was shown before the key was given
    assert "not accepted" in result["refused"]
    assert "api_key" not in result["src"] and result["audio_status"] == 200  # the cookie, not the key
    assert result["call_id"].startswith("rtc_") and KEY not in result["visible"]
    assert result["reloaded"] and result["signed_out"]  # signed in across a reload, until signing out
    assert result["error_hidden"]

    # The call was opened with an ephemeral key minted for the page (the realtime scope).
    def realtime_keys(db):
        return db.execute("SELECT COUNT(*) FROM access_keys WHERE scope = 'realtime'").fetchone()[0]

    assert await store.read(realtime_keys) == 1
