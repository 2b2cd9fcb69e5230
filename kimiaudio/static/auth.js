// kimiaudio demo page: signing in, and fetch() for the page's own routes.
// When the server needs an API key (GET /api/auth), the page asks for it once and trades it
// for a sign-in cookie (POST /api/signin; HttpOnly: no script can read it); the key itself is
// forgotten at once. The cookie goes with every request to the page's routes under /api/ and
// with <audio> sources; calls use an ephemeral key minted for each (call.js), as OpenAI's
// browser examples do. Plain JavaScript, no build step; loaded before app.js.
"use strict";

// The server does not answer; `then` says what to do once it does.
function unreachable(then) {
  return `Cannot reach the kimiaudio server. Is \`python -m kimiaudio serve\` still running? ${then}`;
}
const UNREACHABLE = unreachable("Reload the page once it is.");

class Unauthorized extends Error {}

// fetch() for the page's routes (the sign-in cookie goes by itself); a 401 asks to sign in again.
async function apiFetch(path, options = {}) {
  const resp = await fetch(path, { credentials: "same-origin", ...options });
  if (resp.status === 401) {
    showLogin("Sign in again: the server needs its API key.");
    throw new Unauthorized("The server needs an API key: enter it above.");
  }
  return resp;
}

async function apiError(resp) {
  try {
    const body = await resp.json();
    if (body && body.error && body.error.message) return body.error.message;
  } catch (e) { /* not JSON */ }
  return `${resp.status} ${resp.statusText}`;
}

function showLogin(message) {
  $("login").hidden = false;
  $("login-message").textContent = message || "";
  $("signout").hidden = true;
  $("api-key").focus();
}

async function login(event) {
  event.preventDefault();
  const field = $("api-key");
  const key = field.value.trim();
  if (!key) return;
  field.value = ""; // the key is not kept: the cookie stands for it
  let resp;
  try {
    resp = await fetch("/api/signin", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ api_key: key }),
    });
  } catch (e) {
    showLogin(UNREACHABLE);
    return;
  }
  if (!resp.ok) {
    showLogin(resp.status === 401 ? "That key was not accepted." : await apiError(resp));
    return;
  }
  $("login").hidden = true;
  $("signout").hidden = !(await resp.json()).required;
  hideError();
  start();
}

async function signOut() {
  disconnect(); // a call, or a Connect still on its way
  await fetch("/api/signout", { method: "POST" }).catch(() => null);
  // Nothing of the signed-out user's conversations stays on screen: the call's transcript
  // (words and replays) goes with the list, the search and the conversation shown.
  $("transcript").replaceChildren();
  session.responses.clear();
  session.items.clear();
  session.userTurns.clear();
  session.continueId = session.conversationId = null;
  noteConversation();
  forgetConversations(); // history.js
  hideError();
  showLogin("Signed out.");
}

// Ask to sign in first if the server needs a key and this browser has not signed in.
function checkSignIn() {
  fetch("/api/auth")
    .then((resp) => resp.json())
    .then((auth) => {
      if (auth.required && !auth.signed_in) {
        showLogin("This server needs an API key.");
        return;
      }
      $("signout").hidden = !auth.required;
      start();
    })
    .catch(() => showError(UNREACHABLE));
}
