"""The demo page against a server with an API key, in headless Chromium: it asks for the key,
refuses a wrong one, and with the right one signs in, lists and replays the stored
conversations and calls the server as OpenAI's browser examples do (an ephemeral key from its
backend, the SDP offer to /v1/realtime/calls). The key itself is kept nowhere a script or a
URL could show it: what the browser keeps is an HttpOnly sign-in cookie. Signing out leaves
nothing of the signed-out user's conversations on the page, even where answers come late; a
call still connecting then is given up, and the server does not keep its slot."""

import asyncio
import logging

import numpy as np
import pytest

from kimiaudio.server.context import SERVER_CONTEXT
from kimiaudio.server.middleware.access import API_KEY_ENV

from helpers.audio import silence, write_clip
from helpers.browser import BROWSER_MARKS, HOLD_CALL_ANSWERS, close_reasons, start_chromium, wait_for_script
from helpers.waiting import eventually

pytestmark = BROWSER_MARKS
KEY = "page-test-key-42"
# The page's fetches of its conversations answered, but their answers held back until `held`'s
# `deliver` gives them; `read` counts those the page has read and acted on (a task queued
# once the body is read runs after what the page does with it).
HOLD_CONVERSATION_ANSWERS = """
    window.held = [];
    window.read = 0;
    window.realFetch = fetch;
    fetch = (url, options) => realFetch(url, options).then((resp) => {
        if (!String(url).startsWith('/api/conversations')) return resp;
        const json = resp.json.bind(resp);
        resp.json = () => json().then((body) => { setTimeout(() => read++); return body; });
        return new Promise((deliver) => held.push({ url: String(url), deliver: () => deliver(resp) }));
    });"""


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


async def test_sign_out_leaves_a_clean_page_for_the_next_sign_in(server, tmp_path, speech):
    """Signed out mid-call, with a conversation talked in, shown and searched: nothing of it stays
    on the page or in what the browser may still send, and signing in again starts afresh."""
    store = server.app[SERVER_CONTEXT].store
    shown = await store.create_conversation("Stored earlier")
    await store.add_turn(shown["id"], "user", audio=np.full(8000, 0.1, np.float32))
    await store.add_turn(shown["id"], "assistant", "A stored answer.")  # what the search finds
    wav = write_clip(tmp_path / "mic.wav", [silence(1.5), speech[0], silence(60.0)])
    url = str(server.make_url("/"))
    page_state = """
        return {
            transcript: document.querySelectorAll('#transcript li').length,
            listed: document.querySelectorAll('#conversations li:not(.muted)').length,
            detail: document.querySelectorAll('#detail-turns li').length,
            detailHidden: document.getElementById('conversation-detail').hidden,
            search: document.getElementById('search').value,
            note: document.getElementById('conversation-note').textContent,
            errorHidden: document.getElementById('error-banner').hidden,
            ids: [session.conversationId, session.continueId, selectedId],
        };"""

    def sign_in(driver):
        driver.find_element("id", "api-key").send_keys(KEY)
        driver.find_element("css selector", "#login button").click()
        wait_for_script(driver, "return document.getElementById('login').hidden")

    def drive():
        driver = start_chromium(tmp_path, wav)
        try:
            driver.get(url)
            wait_for_script(driver, "return !document.getElementById('login').hidden")
            sign_in(driver)
            driver.find_element("id", "connect").click()
            wait_for_script(driver, "return document.querySelectorAll('#transcript .turn.user').length > 0")
            wait_for_script(driver, "return document.querySelectorAll('#conversations li:not(.muted)').length === 2")
            driver.find_element("xpath", "//ul[@id='conversations']/li[contains(., 'A stored answer.')]").click()
            wait_for_script(driver, "return !document.getElementById('conversation-detail').hidden")
            # A slow network: the answers to a search and to another click come after the sign-out.
            driver.execute_script(HOLD_CONVERSATION_ANSWERS)
            driver.find_element("id", "search").send_keys("stored")
            driver.find_element("xpath", "//ul[@id='conversations']/li[not(contains(., 'A stored answer.'))]").click()
            wait_for_script(driver, "return held.some((h) => h.url.includes('q=stored'))")
            wait_for_script(driver, "return held.some((h) => /^[/]api[/]conversations[/][^/?]+$/.test(h.url))")
            driver.find_element("id", "signout").click()
            wait_for_script(driver, "return !document.getElementById('login').hidden")
            driver.execute_script("fetch = realFetch; held.forEach((h) => h.deliver());")
            wait_for_script(driver, "return read === held.length")
            after_sign_out = driver.execute_script(page_state)
            refused = driver.execute_async_script(
                "const done = arguments[0]; fetch('/api/conversations').then((r) => done(r.status));"
            )
            sign_in(driver)
            wait_for_script(driver, "return document.querySelectorAll('#conversations li').length > 0")
            return after_sign_out, refused, driver.execute_script(page_state)
        finally:
            driver.quit()

    after_sign_out, refused, signed_in_again = await asyncio.to_thread(drive)
    assert after_sign_out == {
        "transcript": 0,
        "listed": 0,
        "detail": 0,
        "detailHidden": True,
        "search": "",
        "note": "A new conversation starts when you speak.",
        "errorHidden": True,
        "ids": [None, None, None],
    }
    assert refused == 401  # the sign-in cookie is gone
    assert signed_in_again == {**after_sign_out, "listed": 2}


async def test_sign_out_while_connecting_gives_the_call_up(server, tmp_path, caplog):
    """Signed out while the server answers Connect's offer: no error of the call given up is
    shown, and the call the server let in is hung up at once, not left to time out."""
    caplog.set_level(logging.INFO, "kimiaudio.server.transport.rtc_peer")
    sessions = server.app[SERVER_CONTEXT].sessions
    url = str(server.make_url("/"))
    driver = await asyncio.to_thread(start_chromium, tmp_path, None)

    def connect_held():
        driver.get(url)
        wait_for_script(driver, "return !document.getElementById('login').hidden")
        driver.find_element("id", "api-key").send_keys(KEY)
        driver.find_element("css selector", "#login button").click()
        wait_for_script(driver, "return document.getElementById('login').hidden")
        driver.execute_script(HOLD_CALL_ANSWERS)
        driver.find_element("id", "connect").click()
        wait_for_script(driver, "return held.length === 1")

    def sign_out():
        driver.find_element("id", "signout").click()
        wait_for_script(driver, "return !document.getElementById('login').hidden")
        driver.execute_script("held[0].deliver()")

    try:
        await asyncio.to_thread(connect_held)
        assert sessions.num_reserved == 1  # the server has let the call in
        await asyncio.to_thread(sign_out)
        await eventually(lambda: asyncio.sleep(0, sessions.num_reserved == 0), "the call's slot freed")
        page = await asyncio.to_thread(
            driver.execute_script,
            "return [document.getElementById('error-banner').hidden, document.body.dataset.state, session.pc]",
        )
    finally:
        await asyncio.to_thread(driver.quit)
    assert page == [True, "disconnected", None]
    assert close_reasons(caplog.records) == ["the client hung up"]  # not its wait for audio running out
