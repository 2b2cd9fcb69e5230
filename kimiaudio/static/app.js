// kimiaudio demo page: WebRTC to the server (one POST /api/rtc/offer, no trickle ICE), the
// JSON event protocol on the data channel, and the conversation list from the REST API.
// When the server needs an API key (GET /api/auth), the page asks for it once per tab, keeps
// it in sessionStorage and sends it with every request (Authorization: Bearer; ?api_key= for
// <audio> sources, which cannot carry headers). Plain JavaScript, no build step.
"use strict";

const $ = (id) => document.getElementById(id);
const session = {
  pc: null, channel: null, mic: null, meter: null, status: null,
  conversationId: null, // conversation of the live session
  continueId: null, // conversation to continue on the next Connect
  responses: new Map(), // response id -> {li, text, meta}
  userTurns: new Map(), // committed user item id -> {li, text, meta}: its words come later
};
let selectedId = null; // conversation shown in the side panel

// ---------------------------------------------------------------- messages and state
function showError(message) {
  const banner = $("error-banner");
  banner.textContent = message;
  banner.hidden = false;
}
function hideError() { $("error-banner").hidden = true; }

const STATES = {
  disconnected: "disconnected", connecting: "connecting…", listening: "listening",
  "speaking-user": "you are speaking", thinking: "thinking", speaking: "speaking",
};
function setState(state) {
  const el = $("state");
  el.textContent = STATES[state] || state;
  el.className = "state " + state;
  document.body.dataset.state = state;
}

// ---------------------------------------------------------------- API key
const KEY_STORAGE = "kimiaudio.apiKey";
const apiKey = () => sessionStorage.getItem(KEY_STORAGE);

class Unauthorized extends Error {}

// fetch() with the API key; a 401 asks for the key again.
async function apiFetch(path, options = {}) {
  const headers = new Headers(options.headers || {});
  if (apiKey()) headers.set("Authorization", `Bearer ${apiKey()}`);
  const resp = await fetch(path, { ...options, headers });
  if (resp.status === 401) {
    sessionStorage.removeItem(KEY_STORAGE);
    showLogin("The server needs an API key.");
    throw new Unauthorized("The server needs an API key: enter it above.");
  }
  return resp;
}

function showLogin(message) {
  $("login").hidden = false;
  $("login-message").textContent = message || "";
  $("api-key").focus();
}

async function login(event) {
  event.preventDefault();
  const key = $("api-key").value.trim();
  if (!key) return;
  sessionStorage.setItem(KEY_STORAGE, key);
  const resp = await fetch("/api/status", { headers: { Authorization: `Bearer ${key}` } }).catch(() => null);
  if (!resp || resp.status === 401) {
    sessionStorage.removeItem(KEY_STORAGE);
    showLogin(resp ? "That key was not accepted." : UNREACHABLE);
    return;
  }
  $("api-key").value = "";
  $("login").hidden = true;
  hideError();
  start();
}

function audioUrl(conversationId, index) {
  const url = `/api/conversations/${encodeURIComponent(conversationId)}/turns/${index}/audio`;
  return apiKey() ? `${url}?api_key=${encodeURIComponent(apiKey())}` : url;
}

async function apiError(resp) {
  try {
    const body = await resp.json();
    if (body && body.error && body.error.message) return body.error.message;
  } catch (e) { /* not JSON */ }
  return `${resp.status} ${resp.statusText}`;
}

const UNREACHABLE = "Cannot reach the kimiaudio server. Is `python -m kimiaudio serve` still running? Reload the page once it is.";

// ---------------------------------------------------------------- status and demo banner
async function loadStatus() {
  try {
    const resp = await apiFetch("/api/status");
    if (!resp.ok) throw new Error(await apiError(resp));
    session.status = await resp.json();
  } catch (e) {
    if (!(e instanceof Unauthorized)) showError(UNREACHABLE);
    return;
  }
  const s = session.status;
  $("model-info").textContent = s.model && s.model.path ? `model: ${s.model.path}` : "";
  if (s.demo_weights) {
    $("demo-text").textContent = (s.demo_message || "").replace(/^DEMO WEIGHTS:\s*(.)/, (_, c) => c.toUpperCase()) ||
      "The server runs random demo weights: speech is noise. Start it with --model DIR for real answers.";
    $("demo-banner").hidden = false;
  }
}

// ---------------------------------------------------------------- connect / disconnect
async function connect() {
  hideError();
  $("connect").disabled = true;
  setState("connecting");
  try {
    await openSession();
    $("connect").textContent = "Disconnect";
    setState("listening");
  } catch (e) {
    showError(e.message || String(e));
    disconnect();
  } finally {
    $("connect").disabled = false;
  }
}

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

async function openSession() {
  session.mic = await getMicrophone();
  // RTCIceServer dictionaries (TURN ones with the server's time-limited credentials).
  const iceServers = (session.status && session.status.ice_servers) || [];
  const pc = new RTCPeerConnection({ iceServers });
  session.pc = pc;
  session.channel = pc.createDataChannel("events");
  session.channel.onmessage = (e) => onEvent(JSON.parse(e.data));
  session.mic.getTracks().forEach((track) => pc.addTrack(track, session.mic));
  pc.ontrack = (e) => { $("remote-audio").srcObject = e.streams[0] || new MediaStream([e.track]); };
  const lost = () => {
    if (pc !== session.pc) return; // we hung up ourselves
    showError("The connection to the server was lost. Press Connect to start again.");
    disconnect();
  };
  session.channel.onclose = lost; // the server closed the session (or stopped)
  pc.onconnectionstatechange = () => {
    if (pc.connectionState === "failed" || pc.connectionState === "closed") lost();
    // "disconnected" may heal by itself; give it a few seconds.
    if (pc.connectionState === "disconnected") setTimeout(() => { if (pc.connectionState === "disconnected") lost(); }, 5000);
  };
  await pc.setLocalDescription(await pc.createOffer());
  await iceGatheringComplete(pc);

  const body = { sdp: pc.localDescription.sdp, type: "offer" };
  if (session.continueId) body.conversation_id = session.continueId;
  if (typeof voiceSession === "function") body.session = voiceSession(); // static/voices.js
  let resp;
  try {
    resp = await apiFetch("/api/rtc/offer", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
  } catch (e) {
    throw e instanceof Unauthorized ? e : new Error(UNREACHABLE);
  }
  if (resp.status === 503) {
    const wait = resp.headers.get("Retry-After") || "a few";
    throw new Error(`The server is full: ${await apiError(resp)}. Try again in ${wait} seconds.`);
  }
  if (!resp.ok) throw new Error(`The server refused the connection: ${await apiError(resp)}`);
  const answer = await resp.json();
  await pc.setRemoteDescription({ sdp: answer.sdp, type: answer.type });
  startMeter(session.mic);
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

function disconnect() {
  const pc = session.pc;
  session.pc = null;
  session.channel = null;
  if (pc) pc.close();
  if (session.mic) session.mic.getTracks().forEach((t) => t.stop());
  session.mic = null;
  if (session.meter) session.meter.stop();
  session.meter = null;
  $("mic-level").style.width = "0";
  $("connect").textContent = "Connect";
  setState("disconnected");
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

// ---------------------------------------------------------------- server events
function addTurn(role, text) {
  const li = document.createElement("li");
  li.className = `turn ${role}`;
  const span = document.createElement("span");
  span.className = "text";
  span.textContent = text;
  const meta = document.createElement("span");
  meta.className = "meta";
  li.append(span, meta);
  $("transcript").append(li);
  li.scrollIntoView({ block: "end" });
  return { li, text: span, meta };
}

function addReplay(li, conversationId, index) {
  const audio = document.createElement("audio");
  audio.controls = true;
  audio.preload = "none";
  audio.src = audioUrl(conversationId, index);
  li.append(audio);
}

function formatTimings(t) {
  const parts = [];
  if (t.commit_to_first_audio_s !== undefined) parts.push(`first audio after ${t.commit_to_first_audio_s.toFixed(2)} s`);
  else if (t.first_pcm_s !== undefined) parts.push(`first audio generated after ${t.first_pcm_s.toFixed(2)} s`);
  if (t.done_s !== undefined) parts.push(`generated in ${t.done_s.toFixed(2)} s`);
  return parts.join(" · ");
}

function onEvent(event) {
  switch (event.type) {
    case "session.created":
    case "session.updated":
      session.conversationId = event.session.conversation_id;
      noteConversation();
      break;
    case "conversation.created":
      session.conversationId = event.conversation.id;
      noteConversation();
      break;
    case "input_audio_buffer.speech_started":
      setState("speaking-user");
      break;
    case "input_audio_buffer.speech_stopped":
      setState("thinking");
      break;
    case "input_audio_buffer.committed": {
      const turn = addTurn("user", `You spoke (${event.duration_s.toFixed(1)} s)`);
      addReplay(turn.li, event.conversation_id, event.item_index);
      session.userTurns.set(event.item_id, turn);
      refreshConversations();
      break;
    }
    case "conversation.item.input_audio_transcription.completed": { // the user's words
      const turn = session.userTurns.get(event.item_id);
      if (turn) {
        turn.meta.textContent = turn.text.textContent;
        turn.text.textContent = event.transcript || "(no words heard)";
        turn.li.dataset.transcribed = "completed";
      }
      break;
    }
    case "conversation.item.input_audio_transcription.failed": {
      const turn = session.userTurns.get(event.item_id);
      if (turn) {
        turn.meta.textContent = `not transcribed: ${event.error.message}`;
        turn.li.dataset.transcribed = "failed";
      }
      break;
    }
    case "response.created":
      session.responses.set(event.response.id, addTurn("assistant", ""));
      setState("thinking");
      break;
    case "response.output_text.delta": // a text answer
    case "response.output_audio_transcript.delta": { // the text of a spoken answer
      const r = session.responses.get(event.response_id);
      if (r) r.text.textContent += event.delta;
      break;
    }
    case "output_audio_buffer.started": // its first audio is playing
      setState("speaking");
      break;
    case "conversation.item.done": // a stored answer: its index in the conversation
      if (event.item.role === "assistant" && event.item.has_audio && event.item.index !== null) {
        const last = [...session.responses.values()].pop();
        if (last && !last.li.querySelector("audio")) addReplay(last.li, event.conversation_id, event.item.index);
      }
      break;
    case "response.done": {
      const r = session.responses.get(event.response.id);
      if (r) {
        if (!r.text.textContent) r.text.textContent = event.response.text || "(no text)";
        if (event.response.status === "cancelled") r.li.classList.add("interrupted");
        const status = event.response.status === "failed" ? `failed: ${event.response.error || "unknown error"}` : "";
        r.meta.textContent = [status, formatTimings(event.response.timings || {})].filter(Boolean).join(" · ");
        r.li.dataset.status = event.response.status;
      }
      if (session.pc) setState("listening");
      refreshConversations();
      break;
    }
    case "error":
      showError(event.error.message);
      break;
  }
}

function noteConversation() {
  $("conversation-note").textContent = session.conversationId
    ? "Talking in a saved conversation; it is listed on the right."
    : "A new conversation starts when you speak.";
}

function send(event) {
  if (session.channel && session.channel.readyState === "open") session.channel.send(JSON.stringify(event));
}

// ---------------------------------------------------------------- conversation list
let listRequests = 0; // a slower answer to an older search must not replace a newer one

async function refreshConversations() {
  const q = $("search").value.trim();
  const request = ++listRequests;
  let body;
  try {
    const resp = await apiFetch(q ? `/api/conversations?q=${encodeURIComponent(q)}` : "/api/conversations");
    if (!resp.ok) { if (q) showError(await apiError(resp)); return; }
    body = await resp.json();
  } catch (e) {
    return;
  }
  if (request !== listRequests) return;
  const list = $("conversations");
  list.replaceChildren();
  for (const c of body.conversations) {
    const li = document.createElement("li");
    li.textContent = c.title || "Untitled conversation";
    li.classList.toggle("selected", c.id === selectedId);
    const when = document.createElement("span");
    when.className = "when";
    when.textContent = `${new Date(c.updated_at * 1000).toLocaleString()} · ${c.num_turns} turns`;
    li.append(when);
    li.onclick = () => showConversation(c.id);
    list.append(li);
  }
  if (!body.conversations.length) {
    list.innerHTML = q ? '<li class="muted">No conversation matches.</li>' : '<li class="muted">No conversations yet.</li>';
  }
}

async function showConversation(id) {
  let resp;
  try {
    resp = await apiFetch(`/api/conversations/${encodeURIComponent(id)}`);
  } catch (e) {
    return;
  }
  if (!resp.ok) { showError(await apiError(resp)); return; }
  const c = await resp.json();
  selectedId = id;
  $("detail-title").textContent = c.title || "Untitled conversation";
  const turns = $("detail-turns");
  turns.replaceChildren();
  for (const t of c.turns) {
    const li = document.createElement("li");
    li.className = `turn ${t.role}` + (t.interrupted ? " interrupted" : "");
    const span = document.createElement("span");
    span.className = "text";
    if (t.role === "user" && t.has_audio) {
      span.textContent = t.transcript ?? `You spoke (${t.duration_s.toFixed(1)} s)`;
      if (t.text) span.textContent = `${t.text} · ${span.textContent}`;
    } else {
      span.textContent = t.text || "(no text)";
    }
    li.append(span);
    if (t.has_audio) addReplay(li, id, t.index);
    turns.append(li);
  }
  $("conversation-detail").hidden = false;
  refreshConversations();
}

function continueSelected() {
  if (!selectedId) return;
  session.continueId = selectedId;
  if (session.pc) send({ type: "conversation.select", conversation_id: selectedId });
  else $("conversation-note").textContent = "Press Connect to continue the selected conversation.";
  $("transcript").replaceChildren();
}

async function deleteSelected() {
  if (!selectedId || !confirm("Delete this conversation and its audio?")) return;
  let resp;
  try {
    resp = await apiFetch(`/api/conversations/${encodeURIComponent(selectedId)}`, { method: "DELETE" });
  } catch (e) {
    return;
  }
  if (!resp.ok) {  // e.g. 409: a live session holds it; it is still there
    showError(await apiError(resp));
    return;
  }
  if (session.continueId === selectedId) session.continueId = null;
  selectedId = null;
  $("conversation-detail").hidden = true;
  refreshConversations();
}

function newConversation() {
  session.continueId = null;
  if (session.pc) send({ type: "conversation.select", conversation_id: null });
  $("transcript").replaceChildren();
  $("conversation-note").textContent = "A new conversation starts when you speak.";
}

// ---------------------------------------------------------------- wiring
$("connect").onclick = () => (session.pc ? disconnect() : connect());
$("continue").onclick = continueSelected;
$("delete").onclick = deleteSelected;
$("new-conversation").onclick = newConversation;
let searchTimer = null;
$("search").oninput = () => { clearTimeout(searchTimer); searchTimer = setTimeout(refreshConversations, 250); };
$("login").onsubmit = login;
setState("disconnected");

function start() {
  loadStatus();
  refreshConversations();
}

// Ask for the key first if the server needs one and this tab has none yet.
fetch("/api/auth")
  .then((resp) => resp.json())
  .then((auth) => { if (auth.required && !apiKey()) showLogin("This server needs an API key."); else start(); })
  .catch(() => showError(UNREACHABLE));
