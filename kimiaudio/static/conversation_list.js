// kimiaudio demo page: the list of stored conversations (GET /api/conversations), newest first,
// 100 at a time ("Show older"), and its search box. Loaded before history.js, which shows the
// one chosen.
"use strict";

let listRequests = 0; // a slower answer to an older search must not replace a newer one
let listedQuery = null; // the search whose results the list shows (null: none, or one refused)

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
  li.dataset.updatedAt = c.updated_at;
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
// it is still listed (a new search or signing out removes it).
function appendConversations(list, body, q) {
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
      notReached(e); // history.js
      return;
    }
    if (!more.isConnected) return;
    const pressed = document.activeElement === more;
    more.remove();
    const before = list.lastElementChild;
    // One that moved to the top since this page was asked for is listed there already.
    const listed = new Set([...list.children].map((li) => li.dataset.id));
    next.conversations = next.conversations.filter((c) => !listed.has(c.id));
    appendConversations(list, next, q);
    // The item pressed is gone: a keyboard user goes on from the first of the page shown.
    if (pressed) (before.nextElementSibling || before).focus({ preventScroll: true });
  };
  more.onclick = fetchMore;
  list.append(more);
}

// What the list shows beyond the first page `body` of the same search: the items older than its
// last conversation (by updated_at, then id, as the server orders them) that it does not hold,
// and the "Show older" item after them.
function loadedBeyond(list, body) {
  if (!body.has_more) return [];
  const last = body.conversations[body.conversations.length - 1];
  const fresh = new Set(body.conversations.map((c) => c.id));
  const older = (li) => {
    const at = Number(li.dataset.updatedAt);
    return at < last.updated_at || (at === last.updated_at && li.dataset.id < last.id);
  };
  return [...list.children].filter((li) => li.classList.contains("more") ||
    (li.dataset.id && !fresh.has(li.dataset.id) && older(li)));
}

// Asks for the first page of the search in the box. A new search fills the list anew; the same
// one (after each turn and answer of a call, after a delete) puts the first page in place of what
// it covers and keeps the older pages the person loaded, the focus and where the list was
// scrolled to. A search the server refuses (too long, say) says why in the list, in place of the
// last search's results, until the search is changed. One typed (`searched`) that does not reach
// the server says so, instead of leaving the last results listed as its own.
async function refreshConversations(searched = false) {
  const q = $("search").value.trim();
  const request = ++listRequests;
  let body, refused = null;
  try {
    const resp = await apiFetch(conversationsUrl(q, null));
    if (!resp.ok && !q) return;
    if (resp.ok) body = await resp.json();
    else refused = `This search cannot be run (${await apiError(resp)}).`;
  } catch (e) {
    if (searched && request === listRequests) notReached(e); // history.js
    return;
  }
  if (request !== listRequests) return;
  const list = $("conversations");
  const focused = list.contains(document.activeElement) ? document.activeElement : null;
  const scrolled = list.scrollTop;
  const same = refused === null && q === listedQuery;
  const kept = same ? loadedBeyond(list, body) : [];
  listedQuery = refused === null ? q : null;
  list.replaceChildren();
  if (refused !== null) {
    list.append(mutedItem(refused));
    return;
  }
  if (kept.length) {
    for (const c of body.conversations) list.append(conversationItem(c));
    list.append(...kept);
  } else {
    appendConversations(list, body, q);
  }
  if (!body.conversations.length) list.append(mutedItem(q ? "No conversation matches." : "No conversations yet."));
  if (same) list.scrollTop = scrolled;
  const again = focused && (focused.isConnected ? focused
    : [...list.children].find((li) => focused.dataset.id && li.dataset.id === focused.dataset.id));
  if (again) again.focus({ preventScroll: true });
}

// The conversation listed after `id`, or before it when it is the last listed (the first listed
// when it is not listed at all); null when the list holds no other.
function listNeighbour(id) {
  const items = [...$("conversations").children].filter((li) => li.dataset.id);
  const at = items.findIndex((li) => li.dataset.id === id);
  if (at < 0) return items[0] || null;
  return items[at + 1] || items[at - 1] || null;
}

function unlist(id) {
  for (const li of $("conversations").querySelectorAll("li")) if (li.dataset.id === id) li.remove();
}

function mutedItem(text) {
  const li = document.createElement("li");
  li.className = "muted";
  li.textContent = text;
  return li;
}
