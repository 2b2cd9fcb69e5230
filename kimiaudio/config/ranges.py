"""The ranges and choices settings share: each declared once, used by the config sections
(sections.py) and by the code that checks requests built outside a config file the same way
(engine/sampling_params.py, layers/stream_sampling.py, server/inputs/openai_params.py)."""

from kimiaudio.validation import Bounds

# [model] weights and [detok] weights (models/quantize.py says what each quantizes).
WEIGHT_CHOICES = ("auto", "bf16", "fp8", "int8")
# Ranges shared with engine/sampling_params.py, which checks requests built in code the same way.
TEMPERATURE = Bounds(min=0.0)  # 0 (or below 1e-6) = greedy
TOP_K = Bounds(0, 1 << 20)  # 0 = the whole vocabulary; more than the vocabulary = all of it
REPETITION_PENALTY = Bounds(min=0.0, min_open=True)  # 1 = off
REPETITION_WINDOW = Bounds(1, 8192)
TOP_P = Bounds(0.0, 1.0, min_open=True)  # 1 = off (the whole distribution)
PRESENCE_FREQUENCY_PENALTY = Bounds(-2.0, 2.0)  # OpenAI's range; 0 = off
MAX_NEW_TOKENS = Bounds(0, 1 << 20)  # 0 = the official limit
TOP_LOGPROBS = Bounds(0, 20)  # OpenAI's: alternatives reported per token
SEED = Bounds(0, 2**64 - 1)  # what torch.Generator.manual_seed accepts
MILLISECONDS = Bounds(0, 60_000)
ODE_STEPS = Bounds(2, 1000)  # the Euler grid needs both ends
CHUNK_TOKENS = Bounds(1, 512)  # 41 s of speech; the DiT's positions cap a chunk anyway
# OpenAI's transcription, audio chat and realtime model names: [server] model_aliases' default.
OPENAI_MODEL_NAMES = (
    "whisper-1",
    "gpt-4o-transcribe",
    "gpt-4o-mini-transcribe",
    "gpt-4o-audio-preview",
    "gpt-4o-audio-preview-2024-12-17",
    "gpt-4o-audio-preview-2025-06-03",
    "gpt-4o-mini-audio-preview",
    "gpt-4o-mini-audio-preview-2024-12-17",
    "gpt-audio",
    "gpt-audio-mini",
    "gpt-4o-realtime-preview",
    "gpt-4o-realtime-preview-2024-10-01",
    "gpt-4o-realtime-preview-2024-12-17",
    "gpt-4o-realtime-preview-2025-06-03",
    "gpt-4o-mini-realtime-preview",
    "gpt-4o-mini-realtime-preview-2024-12-17",
    "gpt-realtime",
    "gpt-realtime-2025-08-28",
    "gpt-realtime-1.5",
    "gpt-realtime-2",
    "gpt-realtime-2.1",
    "gpt-realtime-2.1-mini",
    "gpt-realtime-mini",
    "gpt-realtime-mini-2025-10-06",
    "gpt-realtime-mini-2025-12-15",
)
