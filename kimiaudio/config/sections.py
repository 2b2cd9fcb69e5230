"""The sections of the configuration, one dataclass each ([model], [sampling], ...): every
key with its default and its declared range (`setting`, validation.py). config.toml documents
each key; the package's `Config` holds one of each (config/__init__.py)."""

from __future__ import annotations

from dataclasses import dataclass

from kimiaudio.config.ranges import (
    CHUNK_TOKENS,
    MAX_NEW_TOKENS,
    MILLISECONDS,
    ODE_STEPS,
    OPENAI_MODEL_NAMES,
    PRESENCE_FREQUENCY_PENALTY,
    REPETITION_PENALTY,
    REPETITION_WINDOW,
    SEED,
    TEMPERATURE,
    TOP_K,
    TOP_P,
    WEIGHT_CHOICES,
)
from kimiaudio.validation import Bounds, setting


@dataclass
class ModelConfig:
    # Kimi-Audio-7B-Instruct directory; empty = the embedded demo checkpoint under data_dir.
    path: str = ""
    # THUDM/glm-4-voice-tokenizer directory; empty = `<path>/glm-4-voice-tokenizer`.
    glm_tokenizer_path: str = ""
    device: str = setting("auto", Bounds(pattern=r"auto|cpu|cuda(:\d+)?", means="auto, cpu, cuda or cuda:N"))
    # auto = bf16 on GPU, float32 on CPU
    dtype: str = setting("auto", Bounds(choices=("auto", "float32", "bfloat16", "float16")))
    text_only: bool = False  # skip the detokenizer and vocoder entirely
    # The LM's decoder-layer weights: bf16 = as dtype; fp8 / int8 quantized at load; auto = bf16
    # where the memory plan for server.max_sessions fits the card, else fp8, else int8.
    weights: str = setting("auto", Bounds(choices=WEIGHT_CHOICES))


@dataclass
class SamplingConfig:
    # Defaults of the official infer.py / README.
    text_temperature: float = setting(0.0, TEMPERATURE)
    text_top_k: int = setting(5, TOP_K)
    text_repetition_penalty: float = setting(1.0, REPETITION_PENALTY)
    text_repetition_window: int = setting(16, REPETITION_WINDOW)
    audio_temperature: float = setting(0.8, TEMPERATURE)
    audio_top_k: int = setting(10, TOP_K)
    audio_repetition_penalty: float = setting(1.0, REPETITION_PENALTY)
    audio_repetition_window: int = setting(64, REPETITION_WINDOW)
    # Not official (the official sampler has none; these defaults turn them off): nucleus
    # sampling of each stream, and OpenAI's presence / frequency penalties of the text stream.
    text_top_p: float = setting(1.0, TOP_P)
    audio_top_p: float = setting(1.0, TOP_P)
    text_presence_penalty: float = setting(0.0, PRESENCE_FREQUENCY_PENALTY)
    text_frequency_penalty: float = setting(0.0, PRESENCE_FREQUENCY_PENALTY)
    # 0 = the official limits: 1500 positions in all for speech out, 7500 for text out.
    max_new_tokens: int = setting(0, MAX_NEW_TOKENS)
    seed: int = setting(0, SEED)


@dataclass
class AudioConfig:
    # One spoken turn's audio (a Realtime turn, a transcription's file, one chat message's parts
    # together) longer than this is refused with a clear error; longer speech that the server's
    # VAD hears is cut into turns of at most this (audio/vad.py).
    max_input_seconds: float = setting(120.0, Bounds(0.0, 3600.0, min_open=True))
    # Audio whose peak stays below this (full scale = 1.0) counts as silence and is refused.
    silence_peak: float = setting(1e-3, Bounds(0.0, 1.0, max_open=True))
    # Most utterances the speech encoders take in one batch (pipeline/speech_encoding.py): a
    # burst is encoded batch after batch, each released to its turns as it ends.
    encode_batch_size: int = setting(4, Bounds(1, 256))
    # "official": every utterance's Whisper features from the padded 30 s window, as the
    # official code computes them; "speech": from the utterance's own length (less work, not
    # the official features: README, "Speech encoders").
    whisper_window: str = setting("official", Bounds(choices=("official", "speech")))


@dataclass
class DetokConfig:
    # "official": the official Kimi-Audio streaming exactly (chunks of 30 tokens, 12 look-ahead,
    # 30 ODE steps, no guard), whatever the per-chunk values below say; "low_latency": the
    # per-chunk values below. Cross-field rules: chunk_schedule.py.
    preset: str = setting("low_latency", Bounds(choices=("low_latency", "official")))
    first_chunk_tokens: int = setting(8, CHUNK_TOKENS)  # official: 30; tokens the first chunk waits for
    # official: 12; of those, held back as the next chunk's context
    first_look_ahead_tokens: int = setting(2, Bounds(0, 511))
    first_ode_steps: int = setting(10, ODE_STEPS)  # official: 30; Euler grid points of the first chunk's ODE
    chunk_tokens: int = setting(8, CHUNK_TOKENS)  # official: 30; the second chunk ...
    # ... and each later one this many times the previous (official 1) ...
    chunk_growth: float = setting(1.5, Bounds(1.0, 16.0))
    max_chunk_tokens: int = setting(40, CHUNK_TOKENS)  # ... up to this many tokens (official: 30)
    look_ahead_tokens: int = setting(4, Bounds(0, 511))  # official: 12
    ode_steps: int = setting(16, ODE_STEPS)  # official: 30
    max_kv_cache_frames: int = setting(900, Bounds(1, 1 << 16))  # official: 900
    # Real-time guard: later chunks of sessions about to run dry run with fewer ODE steps, down
    # to this floor; first chunks keep first_ode_steps unless guard_lowers_first_chunk.
    min_ode_steps: int = setting(8, ODE_STEPS)
    guard_lowers_first_chunk: bool = False
    # Most sessions whose chunks run in one worker iteration, most urgent first (see
    # detok/realtime_guard.py); the rest wait for the next iteration. Also the largest batch
    # captured, unless server.max_sessions is smaller (no bigger batch can form: `served_detok`).
    max_batch_sessions: int = setting(16, Bounds(1, 1024))
    # While the LLM has work, a session's next chunk waits until less than this much of its
    # audio is left to play (a reply still waiting for its first audio never waits).
    run_ahead_s: float = setting(0.5, Bounds(0.0, 600.0))
    # On CUDA: replay the DiT steps and the vocoder from CUDA graphs captured per bucket shape.
    cuda_graphs: bool = True
    # The DiT's linear layers: as [model] weights (auto = whatever the LM's auto chose).
    weights: str = setting("auto", Bounds(choices=WEIGHT_CHOICES))


@dataclass
class EngineConfig:
    # Tokens per KV block: a power of two up to 256, the sizes paged-attention kernels take.
    block_size: int = setting(16, Bounds(choices=tuple(2**i for i in range(9))))
    # 0 = what the memory plan leaves of the device (pipeline/memory_plan.py), at most what
    # max_num_seqs sequences of max_model_len positions can use.
    num_kv_blocks: int = setting(0, Bounds(0, 1 << 24))
    max_num_seqs: int = setting(64, Bounds(1, 4096))
    max_num_batched_tokens: int = setting(2048, Bounds(1, 1 << 20))
    max_model_len: int = setting(8192, Bounds(1, 1 << 20))
    # Prefill positions per step while sequences decode (aimed at a mixed step of at most ~1.3
    # decode steps on an H100 with the 7B; bench --random-weights 7b prints mixed_step_ms_p50);
    # with nothing decoding, prefill takes max_num_batched_tokens.
    max_prefill_tokens_while_decoding: int = setting(256, Bounds(1, 1 << 20))
    # Decode steps replayed from CUDA graphs captured at start-up (CUDA only; needs triton).
    cuda_graphs: bool = True
    # With cuda_graphs: mixed steps (prefill chunks beside decodes) replayed from CUDA graphs
    # captured per token bucket (engine/mixed_batch.py); steps past the largest run eagerly.
    mixed_cuda_graphs: bool = True
    # Launch the next step before reading this one's samples (its ids are taken from them on
    # the device), so the host's work between steps overlaps the device's; a step whose
    # sampling needs the host (penalties, nucleus, log-probability alternatives) runs once
    # they are read.
    overlap_steps: bool = True
    # torch intra-op threads of each model worker thread when the model runs on the CPU (0 =
    # torch's default). One per worker leaves a core to the event loop: the LM and detokenizer
    # workers and the loop all compute at once, and oversubscribed cores slow every LM step.
    cpu_threads: int = setting(1, Bounds(0, 1024))


@dataclass
class ServerConfig:
    host: str = setting("127.0.0.1", Bounds(pattern=r"\S+", means="a host name or address"))
    port: int = setting(8080, Bounds(1, 65535))
    # HTTPS (and WSS): PEM certificate (chain) and private key files, both or neither; relative
    # paths are relative to the config file's directory. Empty = plain HTTP.
    tls_cert: str = ""
    tls_key: str = ""
    max_sessions: int = setting(16, Bounds(1, 4096))
    # WebRTC calls (the page's and any other) transcribe each committed user turn (the user's
    # words, shown and stored); a session's transcription setting changes it per session.
    transcribe_input: bool = True
    # e.g. ["stun:stun.l.google.com:19302"]
    ice_servers: list[str] = setting(
        factory=list, bounds=Bounds(pattern=r"(stun|turns?):\S+", means="a stun:, turn: or turns: URL")
    )
    # The turn:/turns: servers' shared secret (coturn: use-auth-secret, static-auth-secret): each
    # peer gets a username and credential valid turn_credential_ttl_s (server/transport/
    # ice_servers.py). The environment variable KIMIAUDIO_TURN_SECRET, when set, takes precedence.
    turn_secret: str = ""
    turn_credential_ttl_s: float = setting(86400.0, Bounds(60.0, 30 * 86400.0))
    # How long a spoken answer of POST /v1/chat/completions stays usable by its audio id.
    audio_answer_ttl_s: float = setting(3600.0, Bounds(1.0, 30 * 86400.0))
    # Required by every route but the demo page (Authorization: Bearer KEY); empty = no key.
    # The environment variable KIMIAUDIO_API_KEY, when set, takes precedence (keeps it out of
    # files); server/access.py checks that it is printable.
    api_key: str = ""
    # Host header values served (a DNS-rebinding page sends its own name); empty = the bound
    # host, localhost, 127.0.0.1 and [::1]; "*" = any (behind a proxy that checks it).
    # A scheme or path would be taken for part of the name and never match a Host header.
    allowed_hosts: list[str] = setting(
        factory=list,
        bounds=Bounds(pattern=r"[^\s/]+", means="a host name without scheme or path, like voice.example.org"),
    )
    # Origins (scheme://host:port) allowed to POST, DELETE or open a WebSocket besides the
    # server's own page, and to call it cross-origin (CORS); requests without an Origin header
    # (non-browser clients) pass.
    allowed_origins: list[str] = setting(
        factory=list, bounds=Bounds(pattern=r"https?://\S+", means="an origin like https://example.org:8443")
    )
    # Proxies (addresses or networks) whose X-Forwarded-For header names the client, where the
    # server counts wrong API keys per client (server/middleware/key_guesses.py); by default this
    # machine, where a front like deploy/haproxy.cfg runs beside the instances.
    trusted_proxies: list[str] = setting(
        factory=lambda: ["127.0.0.1", "::1"],
        bounds=Bounds(pattern=r"[0-9A-Fa-f.:]+(/[0-9]+)?", means="an IP address or network, like 10.0.0.0/8"),
    )
    # Largest request body (34 MB: OpenAI's 25 MB of audio, base64-encoded in a chat request),
    # and how long it may take to arrive.
    max_body_bytes: int = setting(34 * 1024 * 1024, Bounds(1024, 2**31))
    body_timeout_s: float = setting(30.0, Bounds(0.0, 3600.0, min_open=True))
    # On SIGTERM/SIGINT: answers in flight may finish for this long before sessions are closed.
    shutdown_grace_s: float = setting(10.0, Bounds(0.0, 3600.0))
    # The `instance` label of every metric (a fleet's instances scraped by one Prometheus);
    # empty = this machine's hostname and the port, e.g. "gpu-node-1:8081".
    instance_id: str = setting(
        "",
        Bounds(
            pattern=r"|[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}",
            means="empty or up to 128 of A-Za-z0-9_.:- starting with a letter or digit",
        ),
    )
    # Model names the /v1 routes also answer to (and /v1/models lists), so OpenAI's examples
    # run unchanged; kimi-audio-7b-instruct is always served.
    model_aliases: list[str] = setting(
        factory=lambda: list(OPENAI_MODEL_NAMES),
        bounds=Bounds(pattern=r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,99}", means="a model name (letters, digits, . _ : / -)"),
    )
    # The voice OpenAI's voice names (alloy, echo, ...) speak in: a stored voice's name;
    # "" = the model's own voice.
    openai_voice: str = setting("", Bounds(pattern=r"|[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", means="empty or a voice name"))


@dataclass
class VadConfig:
    threshold: float = setting(0.5, Bounds(0.0, 1.0, min_open=True, max_open=True))  # speech probability
    min_speech_ms: int = setting(250, MILLISECONDS)
    silence_ms: int = setting(500, MILLISECONDS)  # end-of-speech silence that commits the turn
    prefix_padding_ms: int = setting(300, MILLISECONDS)
    barge_in: bool = True


@dataclass
class StorageConfig:
    # Relative paths are relative to the config file's directory.
    data_dir: str = setting("data", Bounds(pattern=r".+", means="a non-empty path"))
    database: str = setting("kimiaudio.db", Bounds(pattern=r".+", means="a non-empty file name"))  # inside data_dir
    # The shared database of a fleet of instances: postgresql://user:password@host:port/dbname;
    # empty = the SQLite file above. The environment variable KIMIAUDIO_DATABASE_URL, when set,
    # takes precedence (keeps the password out of files).
    url: str = setting(
        "",
        Bounds(
            pattern=r"|postgres(ql)?://\S+",
            means="empty (SQLite under data_dir) or a postgresql://user:password@host:port/dbname URL",
        ),
    )
    # How long a conversation stays held by a session whose instance stopped renewing it (killed):
    # then another instance may resume it. Renewed every third of it.
    lease_seconds: float = setting(10.0, Bounds(1.0, 3600.0))


@dataclass
class VoicesConfig:
    # The voice of sessions and requests that name none: a stored voice (POST /api/voices);
    # empty = the model's own voice.
    default: str = setting("", Bounds(pattern=r"|[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", means="empty or a voice name"))
    # Device memory for voice prefixes (the DiT's K/V of each reference); the least recently
    # used are dropped beyond it and recomputed from the store when next used.
    cache_mib: int = setting(512, Bounds(0, 1 << 20))
    # 150-frame (3 s) chunks of a reference the DiT attends to, after its rest (official: 10).
    max_prompt_chunks: int = setting(10, Bounds(0, 64))
    # Length of an uploaded reference.
    min_seconds: float = setting(2.0, Bounds(0.5, 600.0))
    max_seconds: float = setting(30.0, Bounds(0.5, 600.0))
