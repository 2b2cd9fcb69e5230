"""Headless Chromium for the page tests (selenium), and waiting on the page's state."""

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM, CHROMEDRIVER = (
    shutil.which("chromium") or "/usr/bin/chromium",
    shutil.which("chromedriver") or "/usr/bin/chromedriver",
)


# The browser tests' markers and skip: without headless Chromium and chromedriver they are skipped.
BROWSER_MARKS = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
        reason="headless Chromium and chromedriver are needed",
    ),
]


def start_chromium(tmp_path: Path, fake_audio: Path | None, allow_mic: bool = True):
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--no-first-run",
        "--autoplay-policy=no-user-gesture-required",
        "--window-size=1200,900",
        f"--user-data-dir={tmp_path / 'chrome-profile'}",
    ):
        options.add_argument(flag)
    options.add_argument("--use-fake-device-for-media-stream")
    if fake_audio is not None:
        options.add_argument(f"--use-file-for-fake-audio-capture={fake_audio}%noloop")
    # Grant the microphone without asking, or answer the permission prompt with "block".
    options.add_argument("--use-fake-ui-for-media-stream" if allow_mic else "--deny-permission-prompts")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, for console_errors()
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


@contextlib.contextmanager
def page_in_chromium(tmp_path: Path, url: str, fake_audio: Path | None = None, width: int | None = None) -> Iterator:
    """Chromium (its microphone playing `fake_audio`, if given) on the page at `url`, in a
    window `width` pixels wide (a phone's: 375) if given; it quits when the block ends."""
    driver = start_chromium(tmp_path, fake_audio)
    try:
        if width is not None:
            driver.set_window_size(width, 800)
        driver.get(url)
        yield driver
    finally:
        driver.quit()


def wait_for_script(driver, script: str, timeout: float = 120.0):
    """Until `script` returns something truthy; the limit catches a hang, not a slow machine."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2).until(lambda d: d.execute_script(script))
    except TimeoutException:  # what the page showed then says more than "timed out"
        raise AssertionError(f"the page never got to {script.strip()!r}; it shows {page_state(driver)}") from None


PAGE_STATE = """return {
    state: document.body.dataset.state,
    banner: document.getElementById('error-banner').hidden ? null : document.getElementById('error-banner').textContent,
    note: document.getElementById('conversation-note').textContent,
    title: document.getElementById('conversation-detail').hidden ? null
        : document.getElementById('detail-title').textContent,
    listed: document.querySelectorAll('#conversations li').length,
}"""


def page_state(driver) -> str:
    """The page's state, banner, note, conversation shown, list length and console errors."""
    try:
        return f"{driver.execute_script(PAGE_STATE)}, console errors {console_errors(driver)}"
    except Exception as exc:  # (the page itself gone: say that instead)
        return f"nothing readable ({type(exc).__name__}: {exc})"


def page_after_events(driver, url: str, events, probe: str) -> list:
    """Open the page at `url`, connect, then hand the page's event handler each of `events` as
    the call's channel would deliver it; -> what the script `probe` returns after each."""
    driver.get(url)
    driver.find_element("id", "connect").click()
    wait_for_script(driver, "return document.body.dataset.state === 'listening'")
    seen = []
    for event in events:
        driver.execute_script("onEvent(arguments[0])", event)
        seen.append(driver.execute_script(probe))
    return seen


def console_errors(driver) -> list[str]:
    """The page's console errors so far (uncaught exceptions, failed loads)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def hold_answers(which: str) -> str:
    """A script: the page's requests for which the JavaScript expression `which` (of `url` and
    `options`, fetch's arguments) is true are answered by the server, but their answers held back
    until `held`'s `deliver` gives them (`realFetch` is the page's own fetch)."""
    return f"""
        window.held = [];
        window.realFetch = fetch;
        fetch = (url, options) => realFetch(url, options).then((resp) => {{
            if (!({which})) return resp;
            return new Promise((deliver) => held.push({{ url: String(url), deliver: () => deliver(resp) }}));
        }});"""


# The call offers (POST /v1/realtime/calls): the server has let the call in, the page waits.
HOLD_CALL_ANSWERS = hold_answers("String(url).startsWith('/v1/realtime/calls')")


def close_reasons(records) -> list[str]:
    """Why each WebRTC call that the log records (pytest's caplog, at INFO) was closed."""
    calls = [r.getMessage() for r in records if r.name == "kimiaudio.server.transport.rtc_peer"]
    return [m.split(" closed: ", 1)[1] for m in calls if " closed: " in m]


async def store_numbered_conversations(store, count: int) -> None:
    """`count` conversations of one answer each, "Conversation 0." the oldest: past 100, the
    page lists them a page at a time ("Show older")."""
    for n in range(count):
        await store.add_turn((await store.create_conversation())["id"], "assistant", f"Conversation {n}.")
