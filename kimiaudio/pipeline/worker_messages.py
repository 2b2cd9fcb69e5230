"""What the model workers' inboxes carry (pipeline/worker.py): one frozen type per kind of
message, matched by its type on the worker's thread.

The LM worker (lm_worker.py) takes SubmitTurn, CancelTurn and DropTurn from the event loop;
the detokenizer worker (detok_worker.py) takes OpenStream, PushCodes, EndTurn and CancelTurn
from the LM worker (and CancelTurn from the event loop, for a turn past the LM). Every worker
also takes the base loop's own Call (worker.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from kimiaudio.pipeline.events import TurnDone
from kimiaudio.pipeline.turn_handle import TurnHandle
from kimiaudio.pipeline.turn_request import TurnRequest
from kimiaudio.pipeline.voice_registry import Voice


@dataclass(frozen=True)
class SubmitTurn:
    """A new turn for the LM worker: encode its audio, then generate."""

    handle: TurnHandle
    request: TurnRequest


@dataclass(frozen=True)
class CancelTurn:
    """End the turn now, status cancelled, wherever it is."""

    turn_id: str


@dataclass(frozen=True)
class DropTurn:
    """Stop generating for a turn that already ended downstream (its detokenizer failed)."""

    turn_id: str


@dataclass(frozen=True)
class OpenStream:
    """A turn that speaks: the detokenizer makes its stream (in `voice`, None: the model's own)."""

    handle: TurnHandle
    seed: int | None
    voice: Voice | None
    playback_speed: float = 1.0  # (TurnRequest's)


@dataclass(frozen=True)
class PushCodes:
    """One LM step's speech codes, (turn id, code) each, in the order generated."""

    codes: list[tuple[str, int]]


@dataclass(frozen=True)
class EndTurn:
    """The LM is done with the turn: its audio is flushed, then `result` delivered."""

    turn_id: str
    result: TurnDone
