// kimiaudio demo page: the voice selector. The choices come from GET /api/voices (voices are
// added with POST /api/voices, see the README); the choice goes with the next Connect (the
// session bound to the call's ephemeral key: call.js) and, while connected, to the live
// session as a session.update. Loaded before app.js, which calls loadVoices once signed in.
"use strict";

const voiceSelect = document.getElementById("voice");
const MODEL_VOICE = "kimi"; // the model's own voice

async function loadVoices() {
  let body;
  try {
    const resp = await fetch("/api/voices");
    if (!resp.ok) return; // e.g. a text-only server: the selector keeps the model's voice
    body = await resp.json();
  } catch (e) {
    return; // app.js reports an unreachable server
  }
  const current = voiceSelect.dataset.chosen || body.default || MODEL_VOICE;
  voiceSelect.replaceChildren(new Option("Kimi (the model's own)", MODEL_VOICE));
  for (const v of body.voices) voiceSelect.append(new Option(`${v.name} (${v.seconds.toFixed(1)} s)`, v.name));
  voiceSelect.value = [...voiceSelect.options].some((o) => o.value === current) ? current : MODEL_VOICE;
}

// The session's audio.output fields chosen here (GA shape).
function voiceOutput() {
  return { voice: voiceSelect.value || MODEL_VOICE };
}

voiceSelect.addEventListener("focus", loadVoices); // voices added since the page loaded
voiceSelect.addEventListener("change", () => {
  voiceSelect.dataset.chosen = voiceSelect.value;
  send({ type: "session.update", session: { type: "realtime", audio: { output: voiceOutput() } } }); // call.js; a no-op while disconnected
});
