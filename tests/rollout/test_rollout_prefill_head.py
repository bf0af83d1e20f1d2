"""The PaddleNLP-forward rollout path (causal.PaddleNLPStepper, any PaddleNLP causal LM; review defect 3): the prefill
applies the LM head to each prompt's last position only, never to every prompt position (at a 152k vocabulary,
[P, L, V] float32 logits are GBs for one row of each prompt). Checked on a real tiny Qwen2 with a forward hook on
its head, and against the model's own full forward at prefill (what the stepper did before) for the sampled tokens
and their log-probs."""
import numpy as np
import paddle
import pytest

from paddle_grpo import rollout
from paddle_grpo.policy import load_tokenizer
from paddle_grpo.policy import causal
from paddle_grpo.policy.causal import load_causal_lm, position_ids_from_mask
from paddle_grpo.rollout.sampling import row_keys

pytestmark = pytest.mark.numerics  # compares float results: CI reruns it on other CPU kernels

TEXTS = ["Zoey is a knight", "What is 12 + 35? The answer", "<|im_start|>user\nYou meet 2 inhabitants"]
G, NEW, TEMPERATURE = 3, 8, 0.7


class FullForwardPrefill(causal.PaddleNLPStepper):
    """The reference: the prefill through the model's own forward (its LM head over every prompt position), keeping
    the last position's logits; decoding as the stepper under test."""

    def start(self, prompt_ids, prompt_mask, G, max_new_tokens):
        position_ids = position_ids_from_mask(prompt_mask)
        out = self.model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=position_ids,
                         use_cache=True, return_dict=True)
        self.cache = causal._expand_cache(out.past_key_values, G)
        self.attention_mask = paddle.repeat_interleave(prompt_mask, G, axis=0)
        self.next_pos = paddle.repeat_interleave(position_ids[:, -1:], G, axis=0) + 1
        return paddle.repeat_interleave(out.logits[:, -1, :].astype("float32"), G, axis=0)


@pytest.fixture(scope="module")
def model_and_prompts(tiny_policy_dir):
    model, tok = load_causal_lm(tiny_policy_dir), load_tokenizer(tiny_policy_dir)
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    L = max(map(len, ids))
    pid = np.array([[tok.pad_token_id] * (L - len(x)) + x for x in ids], dtype="int64")
    mask = np.array([[0] * (L - len(x)) + [1] * len(x) for x in ids], dtype="int64")
    return model, tok, pid, mask


def sample(model, tok, pid, mask, stepper, do_sample):
    keys = row_keys(5, 0, np.arange(len(TEXTS) * G)) if do_sample else None
    return rollout.generate(model, pid, mask, num_samples=G, max_new_tokens=NEW, eos_token_ids=[tok.eos_token_id],
                            pad_token_id=tok.pad_token_id, temperature=TEMPERATURE, do_sample=do_sample,
                            row_keys=keys, stepper=stepper)


def test_the_prefill_applies_the_lm_head_to_the_last_position_only(model_and_prompts):
    model, tok, pid, mask = model_and_prompts
    shapes = []
    hook = model.get_output_embeddings().register_forward_pre_hook(
        lambda layer, inputs: shapes.append(list(inputs[0].shape)))
    try:
        out = sample(model, tok, pid, mask, causal.PaddleNLPStepper, do_sample=False)
    finally:
        hook.remove()
    H = model.config.hidden_size
    P, L = pid.shape
    assert L > 1 and shapes[0] == [P, 1, H], f"prefill head input {shapes[0]}, not [{P}, 1, {H}] (prompt length {L})"
    assert all(s == [P * G, 1, H] for s in shapes[1:])  # one token per decode step
    assert len(shapes) == out.completion_ids.shape[1]  # one head call per generated position


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "keyed"])
def test_the_samples_and_their_logprobs_are_those_of_the_full_forward(model_and_prompts, do_sample):
    model, tok, pid, mask = model_and_prompts
    got = sample(model, tok, pid, mask, causal.PaddleNLPStepper, do_sample)
    ref = sample(model, tok, pid, mask, FullForwardPrefill, do_sample)
    np.testing.assert_array_equal(got.completion_ids.numpy(), ref.completion_ids.numpy())
    np.testing.assert_array_equal(got.lengths, ref.lengths)
    # Only the prefill's head product can differ (one row of a [P, L] GEMM against a [P, 1] one: another blocking
    # of the same H-term dot products). Each logit's float32 error is at most H * 2^-24 * sum_h |x_h w_hv|; a
    # log-prob z_t - logsumexp(z) / T moves by at most twice that / T. Later steps share the decoder's cache.
    head = model.get_output_embeddings()
    with paddle.no_grad():
        hidden = model.get_decoder()(input_ids=paddle.to_tensor(pid), attention_mask=paddle.to_tensor(mask),
                                     position_ids=position_ids_from_mask(paddle.to_tensor(mask)),
                                     return_dict=True).last_hidden_state[:, -1].numpy()
    H = hidden.shape[-1]
    bound = H * 2.0 ** -24 * float((np.abs(hidden) @ np.abs(head.weight.numpy())).max())
    np.testing.assert_allclose(got.sample_logprobs.numpy(), ref.sample_logprobs.numpy(), rtol=0,
                               atol=2 * bound / TEMPERATURE)
