"""What a real-time session's client may change with session.update, validated as one unit.

The session keeps its own copy of the config ([vad] and [sampling]), the answer's modality
(output_type: "both" = speech and its transcript, "text"), turn detection (server_vad: the
silero VAD commits; none: the client commits), whether a VAD commit starts a response,
instructions (a leading user text message of every prompt), the voice (a stored voice's
name, checked against the pipeline's VoiceRegistry, or a stock name = the model's own) and
the sample rate of pcm16 input, OpenAI's `temperature` (of the answer's speech stream, or of
its text stream for a text answer), and whether committed user turns are transcribed
(input_audio_transcription; the page's sessions by default, `[server] transcribe_input`).
The values of a session.update were checked once, as it was parsed (session_update.py);
`apply` adds what needs the session (its speech, its voices) and changes nothing unless all
of it holds. `describe` is the `session` object of
session.created / updated.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from kimiaudio.audio.rates import OPENAI_PCM16_RATE
from kimiaudio.audio.vad import TurnSettings
from kimiaudio.config import Config
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.voice_registry import MODEL_VOICE, Voice, VoiceRegistry
from kimiaudio.server.inputs.openai_params import MODEL_ID
from kimiaudio.server.session.session_update import SessionUpdate
from kimiaudio.text.output_type import BOTH, TEXT, modalities_of

DEFAULT_VOICE = MODEL_VOICE
TRANSCRIPTION_MODEL = MODEL_ID  # what a session transcribing by default reports


class SessionSettings:
    def __init__(self, config: Config, can_speak: bool, voices: VoiceRegistry | None = None, transcribe: bool = False):
        self.config = copy.deepcopy(config)  # session.update changes this copy only
        self.can_speak = can_speak
        self._voices = voices if voices is not None else VoiceRegistry()
        self.output_type = BOTH if can_speak else TEXT
        self.turn_detection = "server_vad"
        self.create_response = True
        self.instructions = ""
        self.voice = config.voices.default or DEFAULT_VOICE
        self.input_rate = OPENAI_PCM16_RATE
        self.temperature: float | None = None  # None: [sampling]'s
        # input_audio_transcription: {"model": name} while committed user turns are transcribed
        self.transcription: dict[str, str] | None = {"model": TRANSCRIPTION_MODEL} if transcribe else None

    def turn_settings(self) -> TurnSettings:
        vad = self.config.vad
        return TurnSettings(
            vad.threshold, vad.min_speech_ms, vad.silence_ms, vad.prefix_padding_ms, self.config.audio.max_input_seconds
        )

    def sampling(
        self, output_type: str = BOTH, temperature: float | None = None, max_new_tokens: int | None = None
    ) -> SamplingParams:
        """One answer's sampling: the session's, with a response.create's temperature and limit."""
        overrides = {}
        temperature = temperature if temperature is not None else self.temperature
        if temperature is not None:
            overrides["audio_temperature" if output_type == BOTH else "text_temperature"] = temperature
        if max_new_tokens is not None:
            overrides["max_new_tokens"] = max_new_tokens
        return SamplingParams.from_config(self.config.sampling, **overrides)

    def answer_type(self, requested: str | None) -> str:
        """The output type of one response (a response.create may ask for text only)."""
        output_type = requested or self.output_type
        return output_type if self.can_speak else TEXT

    def apply(self, update: SessionUpdate) -> None:
        """Apply a session.update (its values already checked); raises KimiAudioError (naming the
        key) and changes nothing when the session cannot take it."""
        # New section objects: the old ones may still be read by a response in flight.
        config = dataclasses.replace(
            self.config,
            vad=dataclasses.replace(self.config.vad, **update.vad),
            sampling=dataclasses.replace(self.config.sampling, **update.sampling),
        )
        if update.output_type == BOTH and not self.can_speak:
            raise KimiAudioError("session.output_type: this server answers in text only (model.text_only = true)")
        if update.voice is not None:
            self._voices.resolve(update.voice)  # an unknown name is refused here, before anything changes
        self.config = config
        if update.output_type is not None:
            self.output_type = update.output_type
        for name in ("turn_detection", "create_response", "instructions", "voice", "input_rate", "temperature"):
            value = getattr(update, name)
            if value is not None:
                setattr(self, name, value)
        if update.transcription is not None:
            self.transcription = update.transcription or None

    def voice_prompt(self, name: str | None = None) -> Voice | None:
        """The voice this session speaks in now, or the one named (None: the model's own);
        raises UnknownVoiceError for a name that is no voice (or a voice deleted since)."""
        return self._voices.resolve(name or self.voice)

    def describe(self, session_id: str, conversation_id: str | None) -> dict[str, Any]:
        vad = self.config.vad
        turn_detection = (
            None
            if self.turn_detection == "none"
            else {
                "type": "server_vad",
                "threshold": vad.threshold,
                "prefix_padding_ms": vad.prefix_padding_ms,
                "silence_duration_ms": vad.silence_ms,
                "create_response": self.create_response,
                "interrupt_response": vad.barge_in,
            }
        )
        return {
            "id": session_id,
            "object": "realtime.session",
            "conversation_id": conversation_id,
            "modalities": modalities_of(self.output_type),
            "instructions": self.instructions,
            "voice": self.voice,
            "input_audio_format": "pcm16",
            "input_audio_rate": self.input_rate,
            "output_audio_format": "pcm16",
            "input_audio_transcription": self.transcription,
            "turn_detection": turn_detection,
            "max_response_output_tokens": self.config.sampling.max_new_tokens or "inf",
            "temperature": self.temperature
            if self.temperature is not None
            else (
                self.config.sampling.audio_temperature
                if self.output_type == BOTH
                else self.config.sampling.text_temperature
            ),
            "vad": dataclasses.asdict(vad),
            "sampling": dataclasses.asdict(self.config.sampling),
            "output_type": self.output_type,
            "can_speak": self.can_speak,
        }
