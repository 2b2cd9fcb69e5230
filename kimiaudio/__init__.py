"""kimiaudio: a self-hosted real-time speech-to-speech server for Kimi-Audio-7B-Instruct."""

__version__ = "0.1.0"
