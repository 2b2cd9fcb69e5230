"""Audio input side: decoding and resampling (io), Whisper log-mel (log_mel), the continuous
Whisper-large-v3 features of Kimi-Audio (whisper_features) and the GLM-4-Voice discrete speech
tokenizer (whisper_vq_encoder, glm4_tokenizer)."""
