// kimiaudio demo page: the speed selector, how fast answers play (OpenAI's audio.output.speed:
// the answer's audio stretched at its own pitch, from the next answer on). The choice goes with
// the next Connect (call.js puts it in the call's session) and, while connected, to the session
// as a session.update. Loaded before app.js.
"use strict";

const speedSelect = document.getElementById("speed");

// The session's audio.output fields chosen here (GA shape).
function speedOutput() {
  return { speed: Number(speedSelect.value) || 1 };
}

speedSelect.addEventListener("change", () => {
  send({ type: "session.update", session: { type: "realtime", audio: { output: speedOutput() } } }); // call.js; a no-op while disconnected
});
