"""Sampling completions: the decode loop (single_turn.py), counter-based sampling noise (sampling.py) and
`generate` (generation.py), which runs them in chunks through the stepper the policy hands in. The package knows no
model (the policy passes a `Stepper`) and no training step.
"""
from .generation import generate
from .single_turn import NUMPY_FROM_VOCAB, Rollout, Stepper, decode, top_p_filter

__all__ = ["NUMPY_FROM_VOCAB", "Rollout", "Stepper", "decode", "generate", "top_p_filter"]
