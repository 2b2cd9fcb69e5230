"""The pipeline: user turns in, text deltas and 24 kHz speech out (pipeline.py), on two worker
threads (lm_worker.py, detok_worker.py), plus the model stack and the offline path. On CUDA
each worker has its stream, and the LM worker runs the speech encoders on a third
(speech_encoding.py): their batches' results reach its stream through the host.

One turn's state, one type per stage, each named for its stage and owner:

| type         | file            | owner                      | holds                                              |
|--------------|-----------------|----------------------------|----------------------------------------------------|
| TurnRequest  | turn_request.py | the caller (submit)        | the user's audio, history, sampling, output, voice |
| HistoryTurn  | turn_request.py | the caller (in a request)  | one earlier turn: role, text, user audio or codes  |
| TurnHandle   | turn_handle.py  | the asyncio loop           | the turn id, submit time, its events as they come  |
| LmTurn       | lm_turn.py      | the LM worker              | its utterances until its encode batches end, then  |
|              |                 |                            | its engine sequence, tokens, decoded text, timings |
| DetokTurn    | detok_turn.py   | the detokenizer worker     | its DetokStream, playback clock, the LM's TurnDone |
| TurnDone     | events.py       | the loop (the last event)  | status, text, tokens, timings, error               |

A transcription of the user's words (transcription.py) is a TurnRequest like any other, at
the engine's background priority.

Outside the served path: OfflineAnswer (offline.py) is one answer of the batch-1 reference
loop (chat, transcribe, the benches); the store's StoredTurn (store/conversation_rows.py) is a
stored turn as loaded, which the server turns into HistoryTurns.
"""
