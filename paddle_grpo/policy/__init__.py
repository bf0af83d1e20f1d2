"""The policy room: the `Policy` interface over causal and encoder-decoder models (loading, sampling, log-probs,
LoRA, saving), the fast decoder forward for Qwen2 and Llama (fast_decoder.py) and LoRA (lora.py).

    policy = load_policy(path)          # CausalPolicy or Seq2SeqPolicy, from the model's config
    rollout = policy.generate(prompt_ids, prompt_mask, num_samples=G, ...)
    logprobs, entropy = policy.logprobs(prompt_ids, prompt_mask, completion_ids, completion_mask)
    resolve_model_dir("Qwen/Qwen2.5-1.5B-Instruct")  # a hub ID -> PaddleNLP's cache directory of it (hub.py)
    critic = load_critic(path)          # PPO / VAPO value model: critic.values(...) -> [n, T] (critic.py)

`path` is a local model directory or a hub ID, which PaddleNLP's cache (downloaded when online) resolves.
"""
from .base import (Policy, freeze, is_encoder_decoder, load_tokenizer, mix_into, parameters_by_decay,
                   position_ids_from_mask, quiet_paddlenlp)
from .causal import CausalPolicy, decoder_path
from .critic import Critic, load_critic
from .hub import resolve_model_dir
from .load import head_chunk_size, load_policy, model_vocab_size, policy_class
from .seq2seq import Seq2SeqPolicy

__all__ = [
    "CausalPolicy", "Critic", "Policy", "Seq2SeqPolicy", "decoder_path", "freeze", "head_chunk_size",
    "is_encoder_decoder",
    "load_critic", "load_policy", "load_tokenizer", "mix_into", "model_vocab_size", "parameters_by_decay",
    "policy_class", "position_ids_from_mask", "quiet_paddlenlp", "resolve_model_dir",
]
