"""Sampling completions: the decode loop (single_turn.py), the multi-turn loop with tools (multi_turn.py),
counter-based sampling noise (sampling.py) and `generate` (generation.py), which runs them in chunks through the
stepper the policy hands in. The package knows no
model (the policy passes a `Stepper`) and no training step.
"""
from .generation import generate, generate_multi_turn
from .multi_turn import decode_turns
from .single_turn import NUMPY_FROM_VOCAB, Rollout, Stepper, ToolStats, decode, top_p_filter

__all__ = ["NUMPY_FROM_VOCAB", "Rollout", "Stepper", "ToolStats", "decode", "decode_turns", "generate",
           "generate_multi_turn", "top_p_filter"]
