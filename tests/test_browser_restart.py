"""The demo page when its server is killed (SIGKILL) and started again on the same data dir, in
headless Chromium against a real `serve` process: the page says at once that the connection is
interrupted, then that it is lost; Connect while the server is down says to press Connect again
once it is back (a reload would forget which conversation to continue); once it is back, Connect
continues the same conversation, its turns still on screen: the dead process's lease on it is
void (no "open in another tab"). On a shared PostgreSQL database that lease lasts until it
expires, and the page says that its own call, cut off, still holds the conversation."""

import os
import re
import signal

from helpers.audio import silence, write_clip
from helpers.browser import BROWSER_MARKS, console_errors, start_chromium, wait_for_script
from helpers.serve_process import SERVE_CONFIG, free_port, start_serve, stop_serve

pytestmark = BROWSER_MARKS

IN_SAVED = "return document.getElementById('conversation-note').textContent.includes('saved conversation')"
BANNER_TEXT = (
    "(document.getElementById('error-banner').hidden ? null : document.getElementById('error-banner').textContent)"
)
BANNER = f"return {BANNER_TEXT};"
# Every state the page shows from now on, in order.
RECORD_STATES = """
    window.states = [];
    new MutationObserver(() => states.push(document.body.dataset.state))
        .observe(document.body, { attributes: true, attributeFilter: ['data-state'] });"""


def talk_then_kill(driver, proc, port: int) -> str:
    """Talk one turn on the page, kill the server under it -> the conversation talked in, once
    the page has given the call up."""
    driver.get(f"http://127.0.0.1:{port}/")
    driver.find_element("id", "connect").click()
    wait_for_script(driver, IN_SAVED)
    wait_for_script(driver, "return document.querySelector('#transcript .turn.assistant[data-status]') !== null")
    driver.execute_script(RECORD_STATES)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    wait_for_script(driver, "return document.body.dataset.state === 'disconnected'")
    return driver.execute_script("return session.continueId")


def test_connect_after_a_kill_and_restart_continues_the_conversation(tmp_path, speech):
    data_dir, port = tmp_path / "data", free_port()
    data_dir.mkdir()
    # Each call's microphone plays the file from its start: one utterance a call.
    wav = write_clip(tmp_path / "mic.wav", [silence(1.5), speech[0], silence(60.0)])
    proc = start_serve(data_dir, port, SERVE_CONFIG)
    driver = start_chromium(tmp_path, wav)
    try:
        first = talk_then_kill(driver, proc, port)
        states, lost = driver.execute_script("return states"), driver.execute_script(BANNER)
        driver.find_element("id", "connect").click()  # the server is still down
        down = wait_for_script(driver, f"return document.body.dataset.state === 'disconnected' && {BANNER_TEXT}")

        proc = start_serve(data_dir, port, SERVE_CONFIG)
        driver.find_element("id", "connect").click()
        wait_for_script(driver, IN_SAVED)
        wait_for_script(driver, "return document.querySelectorAll('#transcript .turn.user').length === 2")
        again = driver.execute_script("return session.conversationId")
        after = driver.execute_script(BANNER)
        errors = [e for e in console_errors(driver) if "ERR_CONNECTION_REFUSED" not in e]
    finally:
        driver.quit()
        if proc.poll() is None:
            stop_serve(proc)
    assert states[-2:] == ["interrupted", "disconnected"]  # told before the page gives up on it
    assert lost == "The connection to the server was lost. Press Connect to start again."
    assert down.endswith("still running? Press Connect again once it is.")
    assert again == first and after is None and errors == []


def test_a_restart_on_a_shared_database_says_the_cut_off_call_still_holds_it(tmp_path, speech, postgres_url):
    data_dir, port = tmp_path / "data", free_port()
    data_dir.mkdir()
    wav = write_clip(tmp_path / "mic.wav", [silence(1.5), speech[0], silence(60.0)])
    # A lease that outlasts the restart: the killed instance's hold is still there after it.
    config = SERVE_CONFIG + "[storage]\nlease_seconds = 300\n"
    database = {"KIMIAUDIO_DATABASE_URL": postgres_url}
    proc = start_serve(data_dir, port, config, env=database)
    driver = start_chromium(tmp_path, wav)
    try:
        first = talk_then_kill(driver, proc, port)
        proc = start_serve(data_dir, port, config, env=database)
        driver.find_element("id", "connect").click()
        refused = wait_for_script(driver, f"return document.body.dataset.state === 'disconnected' && {BANNER_TEXT}")
        continue_id = driver.execute_script("return session.continueId")
    finally:
        driver.quit()
        if proc.poll() is None:
            stop_serve(proc)
    assert re.fullmatch(
        r"The server still holds this conversation for the call that was cut off\. Try again in \d+ seconds\.", refused
    )
    assert continue_id == first  # Connect asks for it again
