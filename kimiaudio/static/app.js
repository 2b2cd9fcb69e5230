// kimiaudio demo page: its state, and what it shows of a call's Realtime events (OpenAI's GA
// shape on the "oai-events" channel: the words as they come, who is speaking, the user's words
// transcribed, barge-in, replay of each turn). Signing in: auth.js; the call: call.js; the
// stored conversations: history.js; the voice: voices.js. Plain JavaScript, no build step.
"use strict";

const $ = (id) => document.getElementById(id);
const session = {
  pc: null, channel: null, mic: null, meter: null, status: null, callId: null,
  attempt: 0, // number of the latest Connect (call.js: a Connect given up has an older one)
  answering: null, // peer connection whose offer the server is answering (call.js)
  endReason: null, // why the server ends the live call, when it said so (shutting_down)
  conversationId: null, // conversation of the live call (the server says which: session.*, conversation.created)
  continueId: null, // conversation to continue on the next Connect
  selecting: null, // conversation the live call asked to move into (conversation.select), until answered
  cutOff: null, // conversation of a call cut off (its connection lost), until a call is answered
  responses: new Map(), // response id -> {li, text, meta}
  generating: null, // the response created and not yet done
  items: new Map(), // assistant item id -> its response id
  userTurns: new Map(), // committed user item id -> {li, text, meta}: its words come later
  // A server `error` event's banner stays up until an answer started after it ends well: the
  // first such response's id (one of its own, a storage error say, must not clear it).
  serverError: false, clearsError: null,
};

// ---------------------------------------------------------------- messages and state
function showError(message) {
  const banner = $("error-banner");
  banner.textContent = message;
  banner.hidden = false;
}
function hideError() {
  $("error-banner").hidden = true;
  session.serverError = false;
  session.clearsError = null;
}
function showServerError(message) {
  showError(message);
  session.serverError = true;
  session.clearsError = null;
}

const STATES = {
  disconnected: "disconnected", connecting: "connecting…", listening: "listening",
  "speaking-user": "you are speaking", thinking: "thinking", speaking: "speaking",
  interrupted: "connection interrupted…",
};
function setState(state) {
  const el = $("state");
  el.textContent = STATES[state] || state;
  el.className = "state " + state;
  document.body.dataset.state = state;
}

// ---------------------------------------------------------------- status and demo banner
async function loadStatus() { // -> whether it loaded
  try {
    const resp = await apiFetch("/api/status");
    if (!resp.ok) throw new Error(await apiError(resp));
    session.status = await resp.json();
  } catch (e) {
    if (!(e instanceof Unauthorized)) showError(UNREACHABLE);
    return false;
  }
  const s = session.status;
  $("model-info").textContent = s.model && s.model.path ? `model: ${s.model.path}` : "";
  if (s.demo_weights) {
    $("demo-text").textContent = (s.demo_message || "").replace(/^DEMO WEIGHTS:\s*(.)/, (_, c) => c.toUpperCase()) ||
      "The server runs random demo weights: speech is noise. Start it with --model DIR for real answers.";
    $("demo-banner").hidden = false;
  }
  return true;
}

// ---------------------------------------------------------------- connect / disconnect
async function connect() {
  hideError();
  const attempt = ++session.attempt;
  $("connect").disabled = true; // until the call is up, or given up (disconnect())
  setState("connecting");
  try {
    // The server was away when the page loaded: what it shows (and the call's ICE servers) first.
    if (!session.status && (await loadStatus())) {
      refreshConversations();
      loadVoices(); // voices.js
    }
    await openSession(attempt); // call.js
    $("connect").textContent = "Disconnect";
    $("connect").disabled = false;
    setState("listening");
  } catch (e) {
    if (attempt !== session.attempt) return; // given up meanwhile: its error is no news
    showError(e.message || String(e));
    disconnect();
  }
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

function formatTimings(t) {
  const parts = [];
  if (t.commit_to_first_audio_s !== undefined) parts.push(`first audio after ${t.commit_to_first_audio_s.toFixed(2)} s`);
  else if (t.first_pcm_s !== undefined) parts.push(`first audio generated after ${t.first_pcm_s.toFixed(2)} s`);
  if (t.done_s !== undefined) parts.push(`generated in ${t.done_s.toFixed(2)} s`);
  return parts.join(" · ");
}

// The user's words replace "You spoke (n s)", which moves to the line's meta.
function userWords(turn, words) {
  if (!turn.li.dataset.transcribed) {
    turn.meta.textContent = turn.text.textContent;
    turn.text.textContent = "";
    turn.li.dataset.transcribed = "partial";
  }
  if (words !== undefined) turn.text.textContent = words;
}

function onEvent(event) {
  switch (event.type) {
    case "session.created":
    case "session.updated":
      session.conversationId = event.session.conversation_id;
      selectDone(session.conversationId, false); // history.js
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
    case "conversation.item.input_audio_transcription.delta": { // the user's words, as they come
      const turn = session.userTurns.get(event.item_id);
      if (turn && turn.li.dataset.transcribed !== "completed") {
        userWords(turn);
        turn.text.textContent += event.delta || "";
      }
      break;
    }
    case "conversation.item.input_audio_transcription.completed": {
      const turn = session.userTurns.get(event.item_id);
      if (turn) {
        userWords(turn, event.transcript || "(no words heard)");
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
      session.generating = event.response.id;
      session.responses.set(event.response.id, addTurn("assistant", ""));
      if (session.serverError && !session.clearsError) session.clearsError = event.response.id;
      setState("thinking");
      break;
    case "response.output_item.added":
      session.items.set(event.item.id, event.response_id);
      break;
    case "response.output_text.delta": // a text answer
    case "response.output_audio_transcript.delta": { // the text of a spoken answer
      const r = session.responses.get(event.response_id);
      if (r) r.text.textContent += event.delta;
      break;
    }
    case "output_audio_buffer.started": // the answer's audio is playing
      setState("speaking");
      break;
    case "output_audio_buffer.stopped": // played out, or cut short (barge-in, response.cancel)
    case "output_audio_buffer.cleared":
      listening();
      break;
    case "conversation.item.done": { // a stored answer: replay it from the conversation
      const r = session.responses.get(session.items.get(event.item.id));
      if (r && event.item.role === "assistant" && event.item.has_audio && event.item.index !== null &&
          !r.li.querySelector("audio")) addReplay(r.li, event.conversation_id, event.item.index);
      break;
    }
    case "response.done": {
      if (session.generating === event.response.id) session.generating = null;
      const r = session.responses.get(event.response.id);
      if (r) {
        if (!r.text.textContent) r.text.textContent = event.response.text || "(no text)";
        if (event.response.status === "cancelled") r.li.classList.add("interrupted");
        const failed = event.response.status === "failed";
        const cut = event.response.status === "incomplete" ? "cut at its length limit" : "";
        const status = failed ? `failed: ${event.response.error || "unknown error"}` : cut;
        r.meta.textContent = [status, formatTimings(event.response.timings || {})].filter(Boolean).join(" · ");
        r.li.dataset.status = event.response.status;
      }
      if (event.response.id === session.clearsError) {
        if (["completed", "incomplete"].includes(event.response.status)) hideError();
        else session.clearsError = null; // the next answer may clear it
      }
      if (document.body.dataset.state !== "speaking") listening();
      refreshConversations();
      break;
    }
    case "error":
      if (event.error.code === "shutting_down") {
        // The channel closes next: lost() (call.js) shows this instead of a lost connection.
        session.endReason = "The server is shutting down. Press Connect to start again.";
      }
      if (["conversation_busy", "conversation_not_found"].includes(event.error.code)) {
        // conversation.select refused (history.js): the call stays in its conversation.
        const refused = session.selecting;
        selectDone(null, true);
        showServerError(event.error.code === "conversation_busy" ? busyMessage("or try again in a few seconds.")
          : conversationGone(refused));
        break;
      }
      showServerError(event.error.message);
      // A committed turn that gets no answer (it could not be stored or answered): nothing
      // follows to end "thinking". One that comes beside an answer leaves it to its response.done.
      if (["turn_failed", "storage_failed"].includes(event.error.code) && !session.generating &&
          document.body.dataset.state === "thinking") listening();
      break;
  }
}

// Back to listening once an answer ends, unless the user is speaking (a barge-in cuts the
// answer while they talk): "you are speaking" stays until speech_stopped.
function listening() {
  if (session.pc && document.body.dataset.state !== "speaking-user") setState("listening");
}

function noteConversation() {
  $("conversation-note").textContent = session.conversationId
    ? "Talking in a saved conversation; it is in the Conversations list."
    : "A new conversation starts when you speak.";
}

// ---------------------------------------------------------------- wiring
$("connect").onclick = () => (session.pc ? disconnect() : connect());
window.addEventListener("pagehide", leavePage); // call.js
// A new choice of conversation answers the banner about the last one (refused, deleted): the
// banner goes, and comes back only if this one fails too.
const acting = (action) => () => { hideError(); action(); };
$("continue").onclick = acting(continueSelected);
$("delete").onclick = acting(deleteSelected);
$("new-conversation").onclick = acting(newConversation);
let searchTimer = null;
$("search").oninput = () => { clearTimeout(searchTimer); searchTimer = setTimeout(() => refreshConversations(true), 250); };
$("login").onsubmit = login;
$("signout").onclick = signOut;
setState("disconnected");

function start() {
  loadStatus();
  refreshConversations();
  loadVoices(); // voices.js
}

checkSignIn(); // auth.js: then start()
