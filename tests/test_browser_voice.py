"""The page's voice selector in headless Chromium against the real server and pipeline (demo
weights): a stored voice appears in it, and the session it connects speaks in that voice."""

import asyncio

from helpers.audio import silence, write_clip
from helpers.browser import BROWSER_MARKS, start_chromium, wait_for_script
from helpers.voice_upload import form

pytestmark = BROWSER_MARKS


async def test_page_speaks_in_the_chosen_voice(tmp_path, speech, espeak_voice, demo_server):
    wav = write_clip(tmp_path / "mic.wav", [silence(1.0), speech[0], silence(20.0)])
    async with demo_server(tmp_path / "data") as (http, pipeline):
        assert (await http.post("/api/voices", data=form("espeak", espeak_voice.read_bytes()))).status == 201
        url = str(http.make_url("/"))

        def drive():
            driver = start_chromium(tmp_path, wav)
            try:
                driver.get(url)
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
            finally:
                driver.quit()

        options = await asyncio.to_thread(drive)
        assert options == ["kimi", "espeak"]
        assert pipeline.requests and all(r.voice is not None and r.voice.name == "espeak" for r in pipeline.requests)
