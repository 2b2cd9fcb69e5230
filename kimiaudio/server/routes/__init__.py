"""The app's routes outside /v1, grouped by what they serve: the demo page (page.py), WebRTC
sessions (rtc_offer.py), stored conversations (conversations.py), voices (voices.py),
operations (ops.py). Each module's `routes` table is added by app.py."""
