"""Model definitions in plain PyTorch: Qwen2 layers, the Kimi-Audio LM, the detokenizer models."""
