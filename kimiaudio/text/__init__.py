"""Text side of the Kimi-Audio prompt: the tiktoken tokenizer with the Kimi special tokens
(tokenizer.py), the named special ids the prompt format uses (special_tokens.py) and the
two-stream prompt builder (prompt.py)."""
