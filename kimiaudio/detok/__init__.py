"""Speech detokenizer: semantic tokens (12.5 Hz) -> 24 kHz waveform.

flow_matching.py runs the DiT's Euler ODE for a batch of chunks, streaming.py keeps one
session's official streaming state (look-ahead, prefix K/V, positions, vocoder cross-fade),
detokenizer.py loads the models and batches the due chunks of many sessions.
"""

from kimiaudio.detok.detokenizer import Detokenizer
from kimiaudio.detok.streaming import DetokSession, StreamParams

__all__ = ["Detokenizer", "DetokSession", "StreamParams"]
