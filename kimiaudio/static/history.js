// kimiaudio demo page: one stored conversation (GET /api/conversations/{id}): its turns with
// their audio, continuing it (the next call's ?conversation_id=, or conversation.select on the
// live call's channel), deleting it. The list they are chosen from: conversation_list.js.
// Loaded before app.js.
"use strict";

let selectedId = null; // conversation shown in the side panel
let shownRequests = 0; // nor a slower answer for a conversation clicked before the last one

function audioUrl(conversationId, index) {
  // The sign-in cookie goes with the request: no key in the URL.
  return `/api/conversations/${encodeURIComponent(conversationId)}/turns/${index}/audio`;
}

function addReplay(li, conversationId, index) {
  const audio = document.createElement("audio");
  audio.controls = true;
  audio.preload = "none";
  audio.src = audioUrl(conversationId, index);
  li.append(audio);
}

// What the person asked of the list (open one, delete one, show older ones) did not reach the
// server: that is said (a sign-in asked for already says why).
function notReached(e) {
  if (!(e instanceof Unauthorized)) showError(unreachable("Try again once it is.")); // auth.js
}

async function showConversation(id) {
  const request = ++shownRequests;
  let c;
  try {
    const resp = await apiFetch(`/api/conversations/${encodeURIComponent(id)}`);
    if (!resp.ok) {
      if (request !== shownRequests) return;
      showError(resp.status === 404 ? conversationGone(id) : await apiError(resp));
      return;
    }
    c = await resp.json();
  } catch (e) {
    if (request === shownRequests) notReached(e);
    return;
  }
  if (request !== shownRequests) return;
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
  // Marked where it is listed (the list itself is as it was).
  for (const li of $("conversations").children) li.classList.toggle("selected", li.dataset.id === id);
}

function continueSelected() {
  if (!selectedId) return;
  // The conversation on screen already (the live call's, or the next Connect's, its last
  // call's turns shown): nothing moves. Asking the server again would cut the answer playing
  // and clear the call's turns from the screen.
  const current = session.pc ? !session.selecting && session.conversationId : session.continueId;
  if (selectedId === current) return;
  if (session.pc) {
    // The server may refuse (conversation_busy: open in another tab): the call and its
    // transcript stay as they are until session.updated says the call moved (selectDone).
    session.selecting = selectedId;
    send({ type: "conversation.select", conversation_id: selectedId });
    return;
  }
  session.continueId = selectedId;
  $("conversation-note").textContent = "Press Connect to continue the selected conversation.";
  $("transcript").replaceChildren();
}

// The server's answer to the live call's conversation.select (app.js onEvent): moved, or refused.
function selectDone(movedTo, refused) {
  if (!session.selecting) return;
  if (refused) {
    session.selecting = null;
  } else if (movedTo === session.selecting) {
    session.selecting = null;
    session.continueId = movedTo;
    $("transcript").replaceChildren();
  }
}

// The server would not open (a call's ?conversation_id=, conversation.select) or delete a
// conversation another session holds; `then`: what to do once it is closed there.
function busyMessage(then) {
  return `That conversation is open in another tab or session: close it there, ${then}`;
}

// ...because it is deleted (from another tab, say): it is forgotten, so that the next Connect
// starts a new conversation instead of asking for it again; the turns on screen, of the last
// call in it, go with it (their replays are gone).
function conversationGone(id) {
  if (session.continueId === id) {
    session.continueId = null;
    $("transcript").replaceChildren();
    noteConversation(); // app.js
  }
  if (selectedId === id) {
    selectedId = null;
    $("conversation-detail").hidden = true;
  }
  unlist(id); // (the first page asked again says nothing of the older ones loaded)
  refreshConversations();
  return "That conversation was deleted.";
}

// Deletes the conversation shown when Delete is pressed; one clicked (or continued) before the
// server answers stays as it is. The server refuses one a live session holds (409): that of
// this page's own call is not asked for, the page says to hang up first.
async function deleteSelected() {
  const id = selectedId;
  if (!id) return;
  if (session.pc && id === session.conversationId) {
    showError("This conversation is in the call on this page: press Disconnect, then Delete.");
    return;
  }
  if (!confirm("Delete this conversation and its audio?")) return;
  let resp;
  try {
    resp = await apiFetch(`/api/conversations/${encodeURIComponent(id)}`, { method: "DELETE" });
  } catch (e) {
    notReached(e);
    return;
  }
  if (!resp.ok) { // it is still there
    // (The server's 409 says to try again in the seconds its hold has left; it is renewed
    // for as long as that call lasts.)
    showError(resp.status === 409 ? busyMessage("then delete it.") : await apiError(resp));
    return;
  }
  // The Delete control goes with the panel: the focus on it (or lost meanwhile) moves on to a
  // neighbour in the list, or to New when none is left, not back to the top of the page.
  const refocus = selectedId === id && [$("delete"), document.body].includes(document.activeElement);
  const neighbour = listNeighbour(id);
  conversationGone(id);
  if (refocus) (neighbour || $("new-conversation")).focus();
}

// Signed out: nothing of the list, the search or the conversation shown stays, and an answer
// still on its way for them is dropped (the request counters move on).
function forgetConversations() {
  listRequests++;
  listedQuery = null;
  shownRequests++;
  selectedId = null;
  $("search").value = "";
  $("conversations").replaceChildren();
  $("detail-turns").replaceChildren();
  $("conversation-detail").hidden = true;
}

function newConversation() {
  session.continueId = null;
  session.selecting = null; // a Continue not answered yet is given up: its move must not count
  if (session.pc) send({ type: "conversation.select", conversation_id: null });
  $("transcript").replaceChildren();
  $("conversation-note").textContent = "A new conversation starts when you speak.";
}
