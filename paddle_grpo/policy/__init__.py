"""The policy room: the `Policy` interface over causal and encoder-decoder models (loading, sampling, log-probs,
LoRA, saving), the fast Qwen2 forward (fast_qwen2.py) and LoRA (lora.py).

    policy = load_policy(path)          # CausalPolicy or Seq2SeqPolicy, from the model's config
    rollout = policy.generate(prompt_ids, prompt_mask, num_samples=G, ...)
    logprobs, entropy = policy.logprobs(prompt_ids, prompt_mask, completion_ids, completion_mask)
"""
from .base import (Policy, freeze, is_encoder_decoder, load_tokenizer, mix_into, parameters_by_decay,
                   position_ids_from_mask, quiet_paddlenlp)
from .causal import CausalPolicy
from .load import load_policy, policy_class
from .seq2seq import Seq2SeqPolicy

__all__ = [
    "CausalPolicy", "Policy", "Seq2SeqPolicy", "freeze", "is_encoder_decoder", "load_policy", "load_tokenizer",
    "mix_into", "parameters_by_decay", "policy_class", "position_ids_from_mask", "quiet_paddlenlp",
]
