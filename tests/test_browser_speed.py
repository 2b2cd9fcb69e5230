"""The page's speed selector in headless Chromium against the real server and pipeline (demo
weights): a speed chosen while the call connects reaches the session, and the answer is heard
(and stored) that much shorter than the audio its codes make."""

import asyncio
import io

import soundfile as sf

from helpers.audio import silence, write_clip
from helpers.browser import BROWSER_MARKS, console_errors, start_chromium, wait_for_script

pytestmark = BROWSER_MARKS


async def test_page_plays_answers_at_the_chosen_speed(tmp_path, speech, demo_server):
    wav = write_clip(tmp_path / "mic.wav", [silence(1.0), speech[0], silence(20.0)])
    async with demo_server(tmp_path / "data") as (http, pipeline):
        url = str(http.make_url("/"))

        def drive():
            driver = start_chromium(tmp_path, wav)
            try:
                driver.get(url)
                driver.find_element("id", "connect").click()
                # Chosen while the call connects (its session already asked for 1x): the choice
                # must still reach the session once the data channel opens.
                wait_for_script(driver, "return session.channel && session.channel.readyState !== 'closed'")
                driver.execute_script("""const s = document.getElementById('speed');
                    s.value = '1.5'; s.dispatchEvent(new Event('change'));""")
                wait_for_script(
                    driver, "return document.querySelectorAll('#transcript .turn.assistant[data-status]').length > 0"
                )
                return console_errors(driver)
            finally:
                driver.quit()

        errors = await asyncio.to_thread(drive)
        assert not errors, errors
        (listed,) = (await (await http.get("/api/conversations")).json())["conversations"]
        turns = (await (await http.get(f"/api/conversations/{listed['id']}")).json())["turns"]
        answer = next(t for t in turns if t["role"] == "assistant" and t["audio_tokens"])
        audio = await (await http.get(f"/api/conversations/{listed['id']}/turns/{answer['index']}/audio")).read()
        pcm, rate = sf.read(io.BytesIO(audio))
    generated = len(answer["audio_tokens"]) * pipeline.samples_per_code
    assert not answer["interrupted"]  # (the microphone is silent after the question: heard whole)
    assert (pcm.size, rate) == (round(generated / 1.5), 24000)
