"""A tiny Llama (grouped-query attention, rope_theta 100,000, tied and untied embeddings) under tensor parallelism 2
(PaddleNLP's sharded layers: the lean decoder path refuses tensor_parallel_degree > 1 and says so) against one
process on the lean path (policy/fast_decoder.py): log-probs, entropies, the embedding's gradient and greedy
generations. Two gloo processes, as the other tensor-parallel tests (tests/parallel/test_distributed.py)."""
import numpy as np
import paddle
import pytest
from launch_helpers import launch, run
from numerics import tiny_lm_tol

V, HIDDEN, INTERMEDIATE, LAYERS = 96, 64, 160, 2


def _save_llama(path, tied, seed):
    """A random LlamaForCausalLM saved with save_pretrained (norm weights random too, so that they matter)."""
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    paddle.seed(seed)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=V, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rope_theta=100000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=tied, dtype="float32"))
    with paddle.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.set_value(1.0 + paddle.randn(p.shape) * 0.1)
    model.save_pretrained(str(path))
    return str(path)


@pytest.mark.e2e
@pytest.mark.numerics
def test_llama_tensor_parallel_2_equals_the_lean_path_in_one_process(tmp_path, repo_root):
    from paddle_grpo.policy import fast_decoder
    from paddle_grpo.policy.causal import completion_logprobs, decoder_path, generate, load_causal_lm

    rng = np.random.default_rng(0)
    pm = np.ones((4, 6), dtype="int64")
    pm[2:, :2] = 0  # the second prompt left-padded
    pid = np.repeat(rng.integers(3, V, size=(2, 6)), 2, axis=0) * pm
    cm = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    inputs = {"prompt_ids": pid, "prompt_mask": pm, "completion_ids": rng.integers(3, V, size=(4, 5)) * cm,
              "completion_mask": cm, "coeff": rng.normal(size=(4, 5)).astype("float32")}
    np.savez(tmp_path / "inputs.npz", **inputs)
    dirs = [_save_llama(tmp_path / "untied", False, 1), _save_llama(tmp_path / "tied", True, 2)]
    run(launch(repo_root / "tests" / "workers" / "tp_llama_worker.py", tmp_path, *dirs, log_dir=tmp_path / "log"),
        repo_root)
    args = [paddle.to_tensor(inputs[k]) for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")]
    m = cm.astype(bool)
    # two ranks' halves of every layer against one process: other sums (tests/numerics.py's bound for these sizes),
    # twice that for gradients
    tol = tiny_lm_tol(INTERMEDIATE, LAYERS, V)
    for i, model_dir in enumerate(dirs):
        ranks = [np.load(tmp_path / f"{i}_rank{r}.npz") for r in (0, 1)]
        model = load_causal_lm(model_dir)
        assert decoder_path(model) == "decoder: fast path (llama)"
        lp, ent = completion_logprobs(model, *args, temperature=0.8, with_entropy=True)
        mask = args[3].astype("float32")
        ((lp * paddle.to_tensor(inputs["coeff"]) * mask).sum() + 0.1 * (ent * mask).sum()).backward()
        full_grad = model.get_input_embeddings().weight.grad.numpy()
        model.eval()
        with paddle.no_grad():
            rollout = generate(model, args[0][::2], args[1][::2], num_samples=2, max_new_tokens=6, eos_token_ids=[1],
                               do_sample=False)
        assert fast_decoder.enabled_for(model)
        for got in ranks:
            assert str(got["path"]) == "decoder: PaddleNLP's forward (tensor_parallel_degree is 2)"
            np.testing.assert_allclose(got["logprobs"][m], lp.numpy()[m], atol=tol, err_msg=model_dir)
            np.testing.assert_allclose(got["entropy"][m], ent.numpy()[m], atol=tol, err_msg=model_dir)
            np.testing.assert_allclose(got["embed_grad"], full_grad, atol=2 * tol * np.abs(full_grad).max(),
                                       err_msg=model_dir)
            # greedy: identical tokens (a flip would need a rounding-sized tie between the top two logits)
            np.testing.assert_array_equal(got["completion_ids"], rollout.completion_ids.numpy(), err_msg=model_dir)
            np.testing.assert_array_equal(got["lengths"], np.asarray(rollout.lengths), err_msg=model_dir)
            np.testing.assert_allclose(got["sample_logprobs"], rollout.sample_logprobs.numpy(), atol=tol,
                                       err_msg=model_dir)
        assert np.abs(full_grad).max() > 1e-4
