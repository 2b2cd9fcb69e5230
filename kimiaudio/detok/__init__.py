"""Speech detokenizer: semantic tokens (12.5 Hz) -> 24 kHz waveform.

Its chunk schedule (first chunk vs later ones, the official preset) is config/chunk_schedule.py;
streaming.py keeps one stream's official streaming state (look-ahead, prefix K/V, positions,
vocoder cross-fade), flow_matching.py runs the DiT's Euler ODE for a batch of chunks in bucket
shapes (buckets.py) on static buffers (dit_batch.py), detokenizer.py loads the models and
batches the due chunks of many streams, dit_vocoder_graphs.py replays them from CUDA graphs, and
realtime_guard.py picks the streams to serve first and the real-time guard's step counts.
"""
