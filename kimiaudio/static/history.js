// kimiaudio demo page: the stored conversations (GET /api/conversations...): the list and its
// search box, one conversation's turns with their audio, continuing one (the next call's
// ?conversation_id=, or conversation.select on the live call's channel), deleting one.
// Loaded before app.js.
"use strict";

let selectedId = null; // conversation shown in the side panel
let listRequests = 0; // a slower answer to an older search must not replace a newer one
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

function conversationsUrl(q, cursor) {
  const params = new URLSearchParams();
  if (q) params.set("q", q);
  if (cursor) params.set("cursor", cursor);
  const query = params.toString();
  return query ? `/api/conversations?${query}` : "/api/conversations";
}

// A list item that acts as a button: reached with Tab, pressed with Enter or Space (a click
// through its onclick of the moment, none while it has none).
function pressable(li) {
  li.tabIndex = 0;
  li.setAttribute("role", "button");
  li.onkeydown = (e) => {
    if (e.key !== "Enter" && e.key !== " ") return;
    e.preventDefault(); // (Space would scroll the list)
    li.click();
  };
  return li;
}

function conversationItem(c) {
  const li = pressable(document.createElement("li"));
  li.textContent = c.title || "Untitled conversation";
  li.dataset.id = c.id;
  li.classList.toggle("selected", c.id === selectedId);
  const when = document.createElement("span");
  when.className = "when";
  const turns = `${c.num_turns} turn${c.num_turns === 1 ? "" : "s"}`;
  when.textContent = `${new Date(c.updated_at * 1000).toLocaleString()} · ${turns}`;
  li.append(when);
  // A new choice of conversation, as Continue, Delete and New are (app.js: acting).
  li.onclick = () => { hideError(); showConversation(c.id); };
  return li;
}

// One page of the list, and a "Show older" item that fetches the next one (its cursor) while
// the list is still the one this request filled.
function appendConversations(list, body, q, request) {
  for (const c of body.conversations) list.append(conversationItem(c));
  if (!body.has_more) return;
  const more = pressable(document.createElement("li"));
  more.className = "more";
  more.textContent = "Show older conversations";
  const fetchMore = async () => {
    more.onclick = null; // one fetch at a time: a double click must not add the page twice
    let next;
    try {
      const resp = await apiFetch(conversationsUrl(q, body.next_cursor));
      if (!resp.ok) { more.onclick = fetchMore; showError(await apiError(resp)); return; }
      next = await resp.json();
    } catch (e) {
      more.onclick = fetchMore;
      notReached(e);
      return;
    }
    if (request !== listRequests) return;
    more.remove();
    appendConversations(list, next, q, request);
  };
  more.onclick = fetchMore;
  list.append(more);
}

// A search the server refuses (too long, say) says why in the list, in place of the last
// search's results, until the search is changed.
async function refreshConversations() {
  const q = $("search").value.trim();
  const request = ++listRequests;
  let body, refused = null;
  try {
    const resp = await apiFetch(conversationsUrl(q, null));
    if (!resp.ok && !q) return;
    if (resp.ok) body = await resp.json();
    else refused = `This search cannot be run (${await apiError(resp)}).`;
  } catch (e) {
    return;
  }
  if (request !== listRequests) return;
  const list = $("conversations");
  // The list is filled anew after each turn and answer: the one a keyboard user is on keeps
  // the focus.
  const focused = list.contains(document.activeElement) ? document.activeElement.dataset.id : undefined;
  list.replaceChildren();
  if (refused !== null) {
    list.append(mutedItem(refused));
    return;
  }
  appendConversations(list, body, q, request);
  const again = [...list.children].find((li) => focused && li.dataset.id === focused);
  if (again) again.focus();
  if (!body.conversations.length) list.append(mutedItem(q ? "No conversation matches." : "No conversations yet."));
}

function mutedItem(text) {
  const li = document.createElement("li");
  li.className = "muted";
  li.textContent = text;
  return li;
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
  // Marked where it is listed: filling the list anew would drop the older pages shown, the
  // one just opened among them.
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
  conversationGone(id);
}

// Signed out: nothing of the list, the search or the conversation shown stays, and an answer
// still on its way for them is dropped (the request counters move on).
function forgetConversations() {
  listRequests++;
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
