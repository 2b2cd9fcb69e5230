// kimiaudio demo page: a WebRTC call, made as OpenAI's Realtime browser examples make one.
// 1. An ephemeral key from the page's backend (POST /api/client_secrets, which mints it as
//    POST /v1/realtime/client_secrets does), with the session to start with (voice and speed).
// 2. A peer connection with the microphone and a data channel named "oai-events", where the
//    Realtime events travel as JSON (GA shape) both ways.
// 3. The SDP offer to POST /v1/realtime/calls (Authorization: Bearer ek_...; Content-Type:
//    application/sdp; ?conversation_id= continues a stored conversation), the SDP answer back
//    (201; the call id in Location). The answer's audio plays from the remote track.
// Hanging up closes the peer connection; the server stores what was heard. Loaded before app.js.
"use strict";

// Connect again continues the conversation on screen; a reload would forget which it is.
const CALL_UNREACHABLE = unreachable("Press Connect again once it is."); // auth.js

async function getMicrophone() {
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    throw new Error("This browser gives the microphone only to https:// or localhost pages. Open the page through http://localhost or set up https.");
  }
  try {
    return await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true, channelCount: 1 },
    });
  } catch (e) {
    if (e.name === "NotAllowedError" || e.name === "SecurityError") {
      throw new Error("Microphone access was denied. Allow the microphone for this page (the icon in the address bar) and press Connect again.");
    }
    if (e.name === "NotFoundError" || e.name === "OverconstrainedError") {
      throw new Error("No microphone was found. Plug one in and press Connect again.");
    }
    throw new Error(`The microphone could not be opened (${e.name}: ${e.message}).`);
  }
}

// The session the page's selectors choose (GA shape): voices.js, speed.js.
function chosenSession() {
  return { type: "realtime", audio: { output: { ...voiceOutput(), ...speedOutput() } } };
}

// The ephemeral key for one call, with the session it starts with bound to it.
async function ephemeralKey() {
  const body = { expires_after: { anchor: "created_at", seconds: 60 }, session: chosenSession() };
  let resp;
  try {
    resp = await apiFetch("/api/client_secrets", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
  } catch (e) {
    throw e instanceof Unauthorized ? e : new Error(CALL_UNREACHABLE);
  }
  if (!resp.ok) {
    const message = `The server refused the session: ${await apiError(resp.clone())}`;
    if (await refusedVoice(resp)) {
      // Deleted since the picker was filled: the picker is filled again, without it.
      await loadVoices(); // voices.js
      throw new Error(`${message}. The voices are updated: choose one and press Connect again.`);
    }
    throw new Error(message);
  }
  return (await resp.json()).value;
}

async function refusedVoice(resp) {
  try {
    return (await resp.json()).error.param === "session.audio.output.voice";
  } catch (e) {
    return false; // not JSON
  }
}

// How long Connect waits for the server (the key, then the call's answer) before it says the
// server does not answer and gives the attempt up; an object, so that a test can shorten it.
const CALL_LIMITS = { answerMs: 20000 };
const NO_ANSWER = "The server does not answer. Is it overloaded or stopped? Press Connect to try again.";

// Each Connect is numbered (session.attempt); disconnect() moves the number on, which gives up
// a Connect still on its way (a sign-out, no answer in time): what it was waiting for is then
// dropped, and no error of it is shown.
class GivenUp extends Error {}
function stillWanted(attempt) {
  if (attempt !== session.attempt) throw new GivenUp();
}

async function openSession(attempt) {
  session.endReason = null;
  const mic = await getMicrophone(); // not timed: the user may take a while to allow it
  if (attempt !== session.attempt) stopTracks(mic);
  stillWanted(attempt);
  session.mic = mic;
  const limit = setTimeout(() => noAnswer(attempt), CALL_LIMITS.answerMs);
  try {
    await callServer(attempt, mic);
  } finally {
    clearTimeout(limit);
  }
  startMeter(mic);
}

function noAnswer(attempt) {
  if (attempt !== session.attempt) return;
  showError(NO_ANSWER); // app.js
  disconnect();
}

async function callServer(attempt, mic) {
  const key = await ephemeralKey();
  stillWanted(attempt);
  const pc = newCall(mic);
  await pc.setLocalDescription(await pc.createOffer());
  await iceGatheringComplete(pc);
  stillWanted(attempt);
  session.answering = pc; // disconnect() leaves it open now: a call the server answers is ended here
  let call;
  try {
    call = await answer(attempt, key, pc.localDescription.sdp);
    await pc.setRemoteDescription({ type: "answer", sdp: call.sdp });
  } catch (e) {
    pc.close();
    throw e;
  } finally {
    if (session.answering === pc) session.answering = null;
  }
  if (attempt !== session.attempt) closeOnceConnected(pc);
  stillWanted(attempt);
  session.callId = call.id;
  session.cutOff = null;
}

// The call's peer connection, the page's session.pc: the microphone's track out, a data channel
// for the events, the answer's audio in. Its events and audio count while it is session.pc.
function newCall(mic) {
  // RTCIceServer dictionaries (TURN ones with the server's time-limited credentials).
  const iceServers = (session.status && session.status.ice_servers) || [];
  const pc = new RTCPeerConnection({ iceServers });
  session.pc = pc;
  session.channel = pc.createDataChannel("oai-events");
  session.channel.onmessage = (e) => { if (pc === session.pc) onEvent(JSON.parse(e.data)); };
  mic.getTracks().forEach((track) => pc.addTrack(track, mic));
  pc.ontrack = (e) => {
    if (pc === session.pc) $("remote-audio").srcObject = e.streams[0] || new MediaStream([e.track]);
  };
  const lost = () => {
    if (pc !== session.pc) return; // we hung up ourselves
    // The server's own reason, if it said why it ends the session (an `error` event before).
    showError(session.endReason || "The connection to the server was lost. Press Connect to start again.");
    disconnect();
  };
  session.channel.onclose = lost; // the server closed the session (or stopped)
  // A choice made while the call was connecting could not be sent then (send() waits for this).
  session.channel.onopen = () => send({ type: "session.update", session: chosenSession() });
  pc.onconnectionstatechange = () => {
    if (pc !== session.pc) return;
    if (pc.connectionState === "failed" || pc.connectionState === "closed") lost();
    // "disconnected" may heal by itself: the page says so at once, and gives it a few seconds.
    if (pc.connectionState === "disconnected") {
      setState("interrupted");
      setTimeout(() => { if (pc.connectionState === "disconnected") lost(); }, 5000);
    }
    if (pc.connectionState === "connected" && document.body.dataset.state === "interrupted") listening(); // app.js
  };
  return pc;
}

// The SDP offer to the server -> its SDP answer and the call's id.
async function answer(attempt, key, offer) {
  const query = session.continueId ? `?conversation_id=${encodeURIComponent(session.continueId)}` : "";
  let resp;
  try {
    resp = await fetch(`/v1/realtime/calls${query}`, {
      method: "POST",
      headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/sdp" },
      body: offer,
    });
  } catch (e) {
    throw new Error(CALL_UNREACHABLE);
  }
  if (resp.status !== 201) stillWanted(attempt); // a refusal of a call given up says nothing
  if ([404, 409, 503].includes(resp.status)) throw new Error(await refusal(resp));
  if (resp.status !== 201) throw new Error(`The server refused the call: ${await apiError(resp)}`);
  return { sdp: await resp.text(), id: (resp.headers.get("Location") || "").split("/").pop() };
}

// A call given up while the server answered it: the server has let it in and holds a session
// slot for it. The close of a connected call reaches the server at once, that of one never
// connected only when the server's wait for its audio runs out; so the call connects (its
// events and audio ignored: session.pc is another) and closes then.
function closeOnceConnected(pc) {
  const close = () => {
    if (["connected", "failed"].includes(pc.connectionState)) pc.close();
  };
  pc.onconnectionstatechange = close;
  close();
}

// One sentence for a call the server cannot take now (or a conversation it cannot open); its own
// message ends with a retry hint of its own, which Retry-After says more exactly, so the page
// keeps only the first part of it.
async function refusal(resp) {
  const after = Number(resp.headers.get("Retry-After"));
  const retry = after > 0 ? `Try again in ${after} second${after === 1 ? "" : "s"}.` : "Try again in a few seconds.";
  let code = "", message = `${resp.status} ${resp.statusText}`;
  try {
    const body = await resp.json();
    code = body.error.code || "";
    message = body.error.message || message;
  } catch (e) { /* not JSON */ }
  if (code === "conversation_not_found") return conversationGone(session.continueId); // history.js
  if (resp.status === 409 && session.cutOff && session.cutOff === session.continueId) {
    // Not another tab: this page's own call, whose server went away (killed, or cut off from
    // the page and the database) before it could let the conversation go; its hold runs out.
    return `The server still holds this conversation for the call that was cut off. ${retry}`;
  }
  if (resp.status === 409) return busyMessage(`or ${retry.toLowerCase()}`);
  if (code === "server_full") return `The server is full: every session slot is in use. ${retry}`;
  if (code === "shutting_down") return `The server is shutting down. ${retry}`;
  if (resp.status === 404) return `The server refused the call: ${message}`;
  const reason = message.replace(/;\s*try again\b.*$/i, "");
  return `The server cannot take the call now (${reason}). ${retry}`;
}

function iceGatheringComplete(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const check = () => {
      if (pc.iceGatheringState === "complete") {
        pc.removeEventListener("icegatheringstatechange", check);
        resolve();
      }
    };
    pc.addEventListener("icegatheringstatechange", check);
    setTimeout(resolve, 5000); // some networks never finish gathering: go with what we have
  });
}

// Leaving the page (closing the tab, reloading, navigating away) hangs up. Closing the peer
// connection reaches the server at once; a page that just goes would hold its session slot
// (and its conversation) until the server's ICE consent checks fail, about half a minute: a
// reload would then find the server full, or its conversation busy.
function leavePage() {
  const answering = session.answering; // (disconnect() leaves a call being answered open)
  if (session.pc || answering) disconnect();
  if (answering) answering.close();
}

function disconnect() {
  session.attempt++; // a Connect still on its way is given up (openSession)
  const pc = session.pc;
  session.pc = null;
  session.channel = null;
  session.callId = null;
  session.selecting = null;
  markCutOff(session.responses.get(session.generating));
  session.generating = null;
  if (document.body.dataset.state === "interrupted") session.cutOff = session.conversationId; // (refusal)
  // Connect again continues the conversation whose turns stay on screen (as Continue does).
  if (session.conversationId) {
    session.continueId = session.conversationId;
    session.conversationId = null;
    $("conversation-note").textContent = "Press Connect to continue this conversation.";
  }
  if (pc && pc !== session.answering) pc.close();
  if (session.mic) stopTracks(session.mic);
  session.mic = null;
  if (session.meter) session.meter.stop();
  session.meter = null;
  $("mic-level").style.width = "0";
  $("connect").textContent = "Connect";
  $("connect").disabled = false;
  setState("disconnected");
}

// An answer still being generated when the call ends gets no response.done: it is marked as one
// that was cut short (the server keeps what was heard of it), not left looking complete.
function markCutOff(r) {
  if (!r) return;
  if (!r.text.textContent) r.text.textContent = "(no text)";
  r.li.classList.add("interrupted");
  r.li.dataset.status = "cancelled";
  r.meta.textContent = "cut short: the call ended";
}

function stopTracks(stream) {
  stream.getTracks().forEach((t) => t.stop());
}

function send(event) {
  if (session.channel && session.channel.readyState === "open") session.channel.send(JSON.stringify(event));
}

// ---------------------------------------------------------------- microphone level meter
function startMeter(stream) {
  const AudioCtx = window.AudioContext || window.webkitAudioContext;
  if (!AudioCtx) return;
  const ctx = new AudioCtx();
  const analyser = ctx.createAnalyser();
  analyser.fftSize = 1024;
  ctx.createMediaStreamSource(stream).connect(analyser);
  const data = new Float32Array(analyser.fftSize);
  let running = true;
  const tick = () => {
    if (!running) return;
    analyser.getFloatTimeDomainData(data);
    let sum = 0;
    for (const v of data) sum += v * v;
    const db = 20 * Math.log10(Math.sqrt(sum / data.length) + 1e-6); // -120..0 dBFS
    $("mic-level").style.width = `${Math.max(0, Math.min(100, (db + 60) * 100 / 60))}%`;
    requestAnimationFrame(tick);
  };
  tick();
  session.meter = { stop() { running = false; ctx.close(); } };
}
