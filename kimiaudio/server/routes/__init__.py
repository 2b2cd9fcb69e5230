"""The app's routes outside /v1, grouped by what they serve: the demo page (page.py), its
sign-in and ephemeral keys (signin.py), WebRTC sessions (rtc_offer.py, the deprecated alias
of /v1/realtime/calls), stored conversations (conversations.py), voices (voices.py),
operations (ops.py). Each module's `routes` table is added by app.py."""
