"""What a real-time session's client may change with session.update, validated as one unit.

The session keeps its own copy of the config ([vad] and [sampling]), the answer's modality
(output_type: "both" = speech and its transcript, "text"), turn detection (server_vad: the
silero VAD commits; none: the client commits), whether a VAD commit starts a response, how
long a silence after an answer prompts one (OpenAI's idle_timeout_ms),
instructions (a leading user text message of every prompt), the voice (a stored voice's
name, checked against the pipeline's VoiceRegistry, or a stock name = the model's own) and
the sample rate of pcm16 input, how fast the answers' audio plays (OpenAI's `speed`: the
audio stretched in time at its pitch, from the next response on), OpenAI's `temperature` (of
the answer's speech stream, or of its text stream for a text answer), whether committed user
turns are transcribed (input_audio_transcription; WebRTC calls by default,
`[server] transcribe_input`; with their logprobs, if `include` asks), whether the input's
steady noise is turned down first (OpenAI's `noise_reduction`), and the session's type:
"realtime" (it answers) or "transcription" (it only transcribes what it hears: no responses,
the words always), and how its conversation is cut when it outgrows the context (OpenAI's
`truncation`). The values of a session.update were checked once, as it was parsed
(session_update.py); `apply` adds what needs the session (its speech, its voices) and changes
nothing unless all of it holds. The `session` object of session.created /
updated is built from these by the connection's event shape (session_objects.py).
"""

from __future__ import annotations

import copy
import dataclasses

from kimiaudio.audio.rates import OPENAI_PCM16_RATE
from kimiaudio.audio.vad import TurnSettings
from kimiaudio.config import Config
from kimiaudio.engine.sampling_params import SamplingParams
from kimiaudio.errors import KimiAudioError
from kimiaudio.pipeline.voice_registry import MODEL_VOICE, UnknownVoiceError, Voice, VoiceRegistry
from kimiaudio.server.session.event_fields import ProtocolError
from kimiaudio.server.session.session_update import SessionTruncation, SessionUpdate, Transcription
from kimiaudio.server.session.turn_detection_field import eager_silence_ms
from kimiaudio.text.output_type import BOTH, TEXT

DEFAULT_VOICE = MODEL_VOICE


class SessionSettings:
    def __init__(self, config: Config, can_speak: bool, voices: VoiceRegistry | None = None):
        self.config = copy.deepcopy(config)  # session.update changes this copy only
        self._server_vad = self.config.vad  # what a turn_detection object's left-out fields return to
        self.can_speak = can_speak
        self._voices = voices if voices is not None else VoiceRegistry()
        self.output_type = BOTH if can_speak else TEXT
        self.turn_detection = "server_vad"
        self.create_response = True
        self.idle_timeout_ms: int | None = None  # None: no idle timeout
        self.eagerness = "auto"  # semantic_vad's, as the client named it (the silence it waits sets [vad])
        self.instructions = ""
        self.voice = config.voices.default or DEFAULT_VOICE
        self.input_rate = OPENAI_PCM16_RATE
        self.temperature: float | None = None  # None: [sampling]'s
        self.speed = 1.0  # of the answers' audio, as it is played (audio/time_stretch.py)
        self.tool_choice = "auto"  # as the client set it; no tool is called either way
        # input_audio_transcription: set while committed user turns are transcribed
        self.transcription: Transcription | None = None
        self.transcription_logprobs = False  # the words come with their logprobs (OpenAI's `include`)
        self.noise_reduction: str | None = None  # "near_field" | "far_field": the input's (audio/noise_reduction.py)
        self.kind = "realtime"  # or "transcription"
        self.truncation = SessionTruncation()

    @property
    def answers_commits(self) -> bool:
        """A commit of the server's VAD starts a response."""
        return self.create_response and self.kind == "realtime"

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

    async def fetch_voices(self, update: SessionUpdate) -> None:
        """Before `apply`: the voice it names, if just stored through another instance."""
        await self._voices.fetch(update.answers.voice)

    def apply(self, update: SessionUpdate) -> None:
        """Apply a session.update (its values already checked); raises KimiAudioError (naming the
        key) and changes nothing when the session cannot take it."""
        # New section objects: the old ones may still be read by a response in flight.
        turns, answers = update.turns, update.answers
        vad = {key: getattr(self._server_vad, key) for key in turns.resets} | turns.vad
        if turns.eagerness is not None and "silence_ms" not in turns.vad:
            vad["silence_ms"] = eager_silence_ms(self._server_vad.silence_ms, turns.eagerness)
        config = dataclasses.replace(
            self.config,
            vad=dataclasses.replace(self.config.vad, **vad),
            sampling=dataclasses.replace(self.config.sampling, **answers.sampling),
        )
        if answers.output_type == BOTH and not self.can_speak:
            raise KimiAudioError("session.output_type: this server answers in text only (model.text_only = true)")
        if answers.voice is not None:  # an unknown name is refused here, before anything changes
            try:
                self._voices.resolve(answers.voice)
            except UnknownVoiceError as exc:
                raise ProtocolError("invalid_value", str(exc), answers.voice_field) from None
        self.config = config
        if turns.detection is not None:  # a turn_detection object replaces the whole, its idle timeout too
            self.idle_timeout_ms = turns.idle_timeout_ms
            self.eagerness = turns.eagerness or "auto"
        for name, value in (
            ("turn_detection", turns.detection),
            ("create_response", turns.create_response),
            ("output_type", answers.output_type),
            ("instructions", answers.instructions),
            ("voice", answers.voice),
            ("temperature", answers.temperature),
            ("speed", answers.speed),
            ("tool_choice", answers.tool_choice),
            ("input_rate", update.input_rate),
            ("truncation", update.truncation),
            ("transcription_logprobs", update.transcription_logprobs),
        ):
            if value is not None:
                setattr(self, name, value)
        if update.transcription is not None:
            self.transcription = update.transcription or None
        if update.noise_reduction is not None:
            self.noise_reduction = update.noise_reduction or None
        if update.kind is not None:
            self.kind = update.kind
        if self.kind == "transcription" and self.transcription is None:
            self.transcription = Transcription()  # what a transcription session is for

    def snapshot(self) -> SessionSettings:
        """The settings as they are now, for a response asked for now: `apply` replaces values
        and config sections and changes none in place, so a later session.update leaves this
        copy as it was (OpenAI takes a session.update sent after a response.create after it)."""
        return copy.copy(self)

    async def fetch_voice(self, name: str | None) -> None:
        """Before `voice_prompt`: the voice named, if just stored through another instance."""
        await self._voices.fetch(name)

    def voice_prompt(self, name: str | None = None) -> Voice | None:
        """The voice this session speaks in now, or the one named (None: the model's own);
        raises UnknownVoiceError for a name that is no voice (or a voice deleted since); `fetch_voice` first."""
        return self._voices.resolve(name or self.voice)
