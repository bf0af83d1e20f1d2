"""The policy room: loading causal and encoder-decoder models, log-probs, the fast Qwen2 forward, LoRA."""
