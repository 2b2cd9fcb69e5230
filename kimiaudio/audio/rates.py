"""The two sample rates of the model's audio, defined once.

User speech enters at 16 kHz: both speech encoders (Whisper's log-mel, the GLM-4-Voice
tokenizer) and silero VAD take it, and user turns are stored at it. Spoken answers leave at
24 kHz: the official BigVGAN vocoder's rate (the pipeline refuses a checkpoint with another),
at which answers are streamed and stored. Anything at another rate is resampled at the edge
(audio/io.py, the transports).
"""

SPEECH_INPUT_RATE = 16000
SPEECH_OUTPUT_RATE = 24000
# OpenAI's "pcm16" audio format is 24 kHz mono by its definition (the Realtime API's and chat
# completions' raw audio), whatever the model's rates; it only happens to equal the output rate.
OPENAI_PCM16_RATE = 24000
