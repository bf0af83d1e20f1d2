"""The pipeline loss's log-probs (step.pipeline_logprobs, review defect 9): the last stage's entropy takes a gradient
only when the loss has an entropy bonus (entropy_coeff > 0), as the non-pipeline update; with entropy_coeff 0 it is
logged without an autograd graph (the unchunked path would otherwise keep [mb, T, V] intermediates for it). The
stage's output is a real tiny Qwen2's (its logits, or its final hidden states for the chunked head)."""
import numpy as np
import paddle
import pytest

from paddle_grpo import step
from paddle_grpo.config import config_from_dict
from paddle_grpo.policy import load_policy


def cfg_of(entropy_coeff):
    return config_from_dict(dict(actor_model_name_or_path="unused", use_rm_server=False, reward_funcs="kk",
                                 train_datasets="unused", rollout_n=2, global_batch_size=2, max_dec_len=4,
                                 min_dec_len=1, max_prompt_len=16, max_length=20, kl_coeff=0.0, temperature=0.7,
                                 entropy_coeff=entropy_coeff))


@pytest.fixture(scope="module")
def stage_output(tiny_policy_dir):
    """(final hidden [2, 9, H], logits [2, 9, V], lm_head, completion ids [2, 4]) of a trainable tiny policy."""
    model = load_policy(tiny_policy_dir).model
    rng = np.random.default_rng(0)
    ids = paddle.to_tensor(rng.integers(3, 300, size=(2, 9)))
    hidden = model.qwen2(input_ids=ids, return_dict=True).last_hidden_state
    return hidden, model.lm_head(hidden), model.lm_head, ids[:, -4:]


@pytest.mark.parametrize("chunked", [False, True])
def test_the_entropy_takes_a_gradient_only_with_an_entropy_bonus(stage_output, chunked):
    hidden, logits, head, completion = stage_output
    out, head, chunk = (hidden, head, 3) if chunked else (logits, None, None)
    lp0, ent0 = step.pipeline_logprobs(out, completion, cfg_of(0.0), head, chunk)
    lp1, ent1 = step.pipeline_logprobs(out, completion, cfg_of(0.01), head, chunk)
    assert ent0.stop_gradient, "entropy_coeff 0: the logged entropy must build no autograd graph"
    assert not ent1.stop_gradient and not lp0.stop_gradient and not lp1.stop_gradient
    # Same kernels in the same process: the detached entropy is the differentiable one's value, exactly.
    np.testing.assert_array_equal(ent0.numpy(), ent1.numpy())
    np.testing.assert_array_equal(lp0.numpy(), lp1.numpy())
