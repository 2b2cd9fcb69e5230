"""The page's voice selector in headless Chromium against the real server and pipeline (demo
weights): a stored voice appears in it, and the session it connects speaks in that voice; one
deleted after the page listed it (another tab, the API) leaves it when Connect is refused for
it, and the next Connect works."""

import asyncio

from helpers.audio import silence, write_clip
from helpers.browser import BROWSER_MARKS, page_in_chromium, wait_for_script
from helpers.voice_upload import form

pytestmark = BROWSER_MARKS

OPTIONS = "[...document.getElementById('voice').options].map((o) => o.value)"


async def test_page_speaks_in_the_chosen_voice(tmp_path, speech, espeak_voice, demo_server):
    wav = write_clip(tmp_path / "mic.wav", [silence(1.0), speech[0], silence(20.0)])
    async with demo_server(tmp_path / "data") as (http, pipeline):
        assert (await http.post("/api/voices", data=form("espeak", espeak_voice.read_bytes()))).status == 201
        url = str(http.make_url("/"))

        def drive():
            with page_in_chromium(tmp_path, url, wav) as driver:
                wait_for_script(
                    driver, "return [...document.getElementById('voice').options].some((o) => o.value === 'espeak')"
                )
                options = driver.execute_script(
                    "return [...document.getElementById('voice').options].map((o) => o.value)"
                )
                driver.execute_script("""const s = document.getElementById('voice');
                    s.value = 'espeak'; s.dispatchEvent(new Event('change'));""")
                driver.find_element("id", "connect").click()
                wait_for_script(
                    driver, "return document.querySelectorAll('#transcript .turn.assistant[data-status]').length > 0"
                )
                return options

        options = await asyncio.to_thread(drive)
        assert options == ["kimi", "espeak"]
        assert pipeline.requests and all(r.voice is not None and r.voice.name == "espeak" for r in pipeline.requests)


async def test_a_chosen_voice_deleted_meanwhile_leaves_the_picker_and_connect_works_again(
    tmp_path, espeak_voice, demo_server
):
    wav = write_clip(tmp_path / "mic.wav", [silence(60.0)])
    async with demo_server(tmp_path / "data") as (http, _):
        assert (await http.post("/api/voices", data=form("espeak", espeak_voice.read_bytes()))).status == 201
        url = str(http.make_url("/"))
        loop = asyncio.get_running_loop()

        def drive():
            with page_in_chromium(tmp_path, url, wav) as driver:
                wait_for_script(driver, f"return {OPTIONS}.includes('espeak')")
                driver.execute_script("""const s = document.getElementById('voice');
                    s.value = 'espeak'; s.dispatchEvent(new Event('change'));""")
                # Deleted elsewhere (another tab, the API) after the page listed it.
                deleted = asyncio.run_coroutine_threadsafe(http.delete("/api/voices/espeak"), loop).result()
                driver.find_element("id", "connect").click()
                wait_for_script(driver, "return !document.getElementById('error-banner').hidden")
                refused = driver.find_element("id", "error-banner").text, driver.execute_script(f"return {OPTIONS}")
                if "espeak" in refused[1]:  # (Connect would ask for it again)
                    return deleted.status, refused, None
                driver.find_element("id", "connect").click()
                wait_for_script(driver, "return session.callId !== null")
                return deleted.status, refused, driver.execute_script("return document.getElementById('voice').value")

        status, (banner, options), voice = await asyncio.to_thread(drive)
    assert status == 200
    assert banner.startswith("The server refused the session: unknown voice 'espeak'")
    assert banner.endswith("The voices are updated: choose one and press Connect again.")
    assert options == ["kimi"] and voice == "kimi"
