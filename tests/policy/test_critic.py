"""The critic (policy/critic.py): the kinds load_critic accepts, values against PaddleNLP's backbone called directly and
numpy, batch independence, gradients, save -> load, a hub ID from a populated cache, and tensor parallelism 2.

Models are the session's tiny random ones (tests/conftest.py): the policy (Qwen2ForCausalLM, hidden 64,
intermediate 128, 2 layers) and the reward model (one-label Qwen2ForSequenceClassification, hidden 32,
intermediate 64, 2 layers). Nothing is downloaded."""
import json
import logging
import os
import shutil
import subprocess
import sys

import numpy as np
import paddle
import pytest
from launch_helpers import launch, run
from numerics import f32_sum_tol

from paddle_grpo.policy import Critic, load_critic
from paddle_grpo.policy.critic import CAUSAL_LM, CRITIC, REWARD_MODEL

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HUB_ID = "tiny-org/tiny-critic"
# Opt-in, as the slow multi-process tests of tests/launch_helpers.py: a second 2-process launch for another family.
SLOW_DIST = pytest.mark.skipif(os.environ.get("PADDLE_GRPO_SLOW_DIST") != "1",
                               reason="a second 2-process launch (the Llama ValueModel); "
                                      "PADDLE_GRPO_SLOW_DIST=1 runs it")


def _file_state(model_dir):
    """{name: numpy} of a save_pretrained directory's single weight file, read with paddle.load (not the critic)."""
    return {k: v.numpy() for k, v in paddle.load(os.path.join(model_dir, "model_state.pdparams")).items()}


def _batch():
    """Left-padded prompts of real lengths 2, 5, 3 (L = 5) and right-padded completions of 4, 2, 3 tokens (T = 4)."""
    rng = np.random.default_rng(0)
    prompt_mask = np.array([[0, 0, 0, 1, 1], [1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    completion_mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    prompt_ids = rng.integers(3, 300, size=prompt_mask.shape) * prompt_mask
    completion_ids = rng.integers(3, 300, size=completion_mask.shape) * completion_mask
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def _tensors(*arrays):
    return [paddle.to_tensor(a) for a in arrays]


def _value_tol(hidden_abs_max, head):
    """Bound on |a - b| of two float32 evaluations of one value by other kernels or padding (tests/numerics.py): the
    final hidden state through 2 layers of about 9 chained sums each plus the final norm (depth 19), each at most 64
    terms (intermediate size; hidden 32, sequences <= 9), terms of size ~1 at random initialisation, scaled by the
    hidden state's largest element; then the head's dot product, which weights those errors by sum|w| and adds its
    own 32-term sum's rounding."""
    w = np.abs(head).sum()
    hidden_err = f32_sum_tol(64, 1.0, depth=19) * hidden_abs_max
    return hidden_err * w + f32_sum_tol(32, hidden_abs_max * w)


def _hidden_abs_max(critic, prompt_ids, completion_ids):
    """The largest |element| of the critic's final hidden states over the whole unpadded batch (a magnitude)."""
    with paddle.no_grad():
        out = critic.backbone(input_ids=paddle.to_tensor(np.concatenate([prompt_ids, completion_ids], axis=1)),
                              return_dict=True)
    return float(paddle.abs(out.last_hidden_state).max())


@pytest.fixture(scope="module")
def reward_critic(tiny_reward_model_dir):
    return load_critic(tiny_reward_model_dir)


# ------------------------------------------------------------------------------------------------------ kinds

def test_a_causal_lm_gives_its_backbone_and_a_zero_value_head(tiny_policy_dir, caplog):
    with caplog.at_level(logging.INFO, logger="paddle_grpo.policy"):
        critic = load_critic(tiny_policy_dir)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("critic:")]
    assert len(lines) == 1 and "is a causal LM (Qwen2ForCausalLM)" in lines[0], lines
    assert "new value head initialised to zeros" in lines[0]
    assert isinstance(critic, Critic) and critic.kind == CAUSAL_LM
    assert critic.head.weight.shape == [64, 1] and not np.any(critic.head.weight.numpy())
    # The backbone is the policy's decoder, weight for weight; the LM head is not part of the critic.
    state = _file_state(tiny_policy_dir)
    own = {k: v.numpy() for k, v in critic.backbone.state_dict().items()}
    assert set(own) == {k[len("qwen2."):] for k in state if k.startswith("qwen2.")}
    for name, value in own.items():
        np.testing.assert_array_equal(value, state["qwen2." + name], err_msg=name)
    assert not any("lm_head" in k for k in critic.state_dict())
    # Zero head: every value is 0, and only the head gets a gradient at first (dV/dh = w = 0).
    values = critic.values(*_tensors(*_batch()))
    assert values.dtype == paddle.float32 and values.shape == [3, 4] and not np.any(values.numpy())
    values.sum().backward()
    assert np.abs(critic.head.weight.grad.numpy()).max() > 0.1
    assert all(p.grad is None or not np.any(p.grad.numpy()) for p in critic.backbone.parameters())


def test_a_reward_model_gives_its_score_head_as_the_value_head(tiny_reward_model_dir, caplog):
    with caplog.at_level(logging.INFO, logger="paddle_grpo.policy"):
        critic = load_critic(tiny_reward_model_dir, trainable=False)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("critic:")]
    assert len(lines) == 1 and "is a reward model (Qwen2ForSequenceClassification)" in lines[0], lines
    assert "score head is the value head" in lines[0]
    assert critic.kind == REWARD_MODEL
    state = _file_state(tiny_reward_model_dir)
    np.testing.assert_array_equal(critic.head.weight.numpy(), state["score.weight"])
    assert np.abs(state["score.weight"]).max() > 0
    assert not critic.model.training and all(p.stop_gradient for p in critic.model.parameters())  # frozen


def test_a_saved_critic_loads_as_a_critic_checkpoint_with_bit_identical_values(reward_critic, tmp_path, caplog):
    critic = load_critic(reward_critic.source)
    args = _tensors(*_batch())
    # One optimizer step first, so that the saved weights are no longer the reward model's.
    opt = paddle.optimizer.AdamW(learning_rate=1e-2, parameters=critic.trainable_parameters())
    (critic.values(*args) ** 2).mean().backward()
    opt.step()
    opt.clear_grad()
    with paddle.no_grad():
        before = critic.values(*args).numpy()
    out = critic.save(str(tmp_path / "critic"))
    config = json.loads((tmp_path / "critic" / "config.json").read_text())
    assert config["score_type"] == "critic" and config["architectures"] == ["Qwen2ForSequenceClassification"]
    assert (tmp_path / "critic" / "tokenizer_config.json").is_file()  # a whole model directory (hub.py)
    with caplog.at_level(logging.INFO, logger="paddle_grpo.policy"):
        again = load_critic(out)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("critic:")]
    assert len(lines) == 1 and "is a critic checkpoint (Qwen2ForSequenceClassification)" in lines[0], lines
    assert again.kind == CRITIC
    with paddle.no_grad():
        after = again.values(*args).numpy()
    np.testing.assert_array_equal(after, before)  # same kernels, same process: bit for bit
    assert np.abs(after - reward_critic.values(*args).numpy()).max() > 1e-4  # and not the reward model's
    for (k, a), (k2, b) in zip(critic.state_dict().items(), again.state_dict().items()):
        assert k == k2
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=k)


def test_load_weights_restores_a_saved_critic_in_place(tiny_reward_model_dir, tiny_policy_dir, tmp_path):
    critic = load_critic(tiny_reward_model_dir)
    args = _tensors(*_batch())
    with paddle.no_grad():
        before = critic.values(*args).numpy()
    critic.save(str(tmp_path / "c"))
    params = [id(p) for p in critic.trainable_parameters()]
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=critic.trainable_parameters())
    critic.values(*args).sum().backward()
    opt.step()
    with paddle.no_grad():
        assert np.abs(critic.values(*args).numpy() - before).max() > 1e-3
        critic.load_weights(str(tmp_path / "c"))
        np.testing.assert_array_equal(critic.values(*args).numpy(), before)
    assert [id(p) for p in critic.trainable_parameters()] == params  # the optimizer's parameters, updated in place
    with pytest.raises(ValueError, match="do not fit this critic"):  # hidden 64 vs 32: another model's weights
        critic.load_weights(tiny_policy_dir)


def test_a_causal_lm_critic_saves_and_loads_as_a_critic(tiny_policy_dir, tmp_path):
    out = load_critic(tiny_policy_dir).save(str(tmp_path / "c"))
    again = load_critic(out)
    assert again.kind == CRITIC and not np.any(again.head.weight.numpy())


def test_wrong_kinds_are_refused_naming_the_file(tiny_policy_dir, tiny_reward_model_dir, tmp_path):
    two = tmp_path / "two_labels"
    shutil.copytree(tiny_reward_model_dir, two)
    config = json.loads((two / "config.json").read_text())
    config["id2label"], config["label2id"] = {"0": "A", "1": "B"}, {"A": 0, "B": 1}
    (two / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"{two}/config.json describes a sequence classifier with 2 labels"):
        load_critic(str(two))
    with pytest.raises(FileNotFoundError, match="critic_model_name_or_path: .*nope"):
        load_critic(str(tmp_path / "nope"))


def test_the_plan_reads_config_json_only(tiny_reward_model_dir, tiny_policy_dir, tmp_path):
    """critic_plan (what --dry_run reports) from config.json alone: the same kind and text as load_critic's line."""
    from paddlenlp.transformers import AutoConfig

    from paddle_grpo.policy.critic import critic_plan

    for name, source in (("rm", tiny_reward_model_dir), ("lm", tiny_policy_dir)):
        (tmp_path / name).mkdir()
        shutil.copy(os.path.join(source, "config.json"), tmp_path / name)
    plans = {n: critic_plan(AutoConfig.from_pretrained(str(tmp_path / n)), str(tmp_path / n)) for n in ("rm", "lm")}
    assert plans["rm"] == (REWARD_MODEL, "a reward model (Qwen2ForSequenceClassification): its one-label score head "
                                         "is the value head")
    assert plans["lm"][0] == CAUSAL_LM and plans["lm"][1].startswith("a causal LM (Qwen2ForCausalLM): its backbone "
                                                                     "with a new value head initialised to zeros")


def _score_layout(reward_dir, out, safetensors=False, backbone="model."):
    """The reward model's weights in PaddleNLP's AutoModelForScore layout (llm/alignment/ppo/models/score_model.py:
    `model` = AutoModel backbone, `score_head` Linear(hidden, score_dim), `normalizer` buffers mean/var/count;
    save_pretrained writes architectures ["AutoModelForScore"] and the score config fields) in directory `out`.
    `backbone="qwen2."`: the older per-family classes' layout (LlamaModelForScore keeps its LlamaModel in `llama`)."""
    state = _file_state(reward_dir)
    layout = {(backbone + k[len("qwen2."):] if k.startswith("qwen2.") else "score_head.weight"): v
              for k, v in state.items()}
    assert set(state) - {k for k in state if k.startswith("qwen2.")} == {"score.weight"}
    layout.update({"normalizer.mean": np.zeros([1], "float32"), "normalizer.var": np.ones([1], "float32"),
                   "normalizer.count": np.array([7], "int64")})
    os.makedirs(out)
    for name in os.listdir(reward_dir):
        if name != "model_state.pdparams":
            shutil.copy(os.path.join(reward_dir, name), out)
    config = json.loads(open(os.path.join(out, "config.json")).read())
    config.update(architectures=["AutoModelForScore"], score_type="reward", score_dim=1, bias=False,
                  do_normalize=True, normalizer_type="RunningMeanStd")
    for key in ("id2label", "label2id"):
        config.pop(key)
    open(os.path.join(out, "config.json"), "w").write(json.dumps(config))
    if safetensors:
        from safetensors.numpy import save_file

        save_file(layout, os.path.join(out, "model.safetensors"))
    else:
        paddle.save({k: paddle.to_tensor(v) for k, v in layout.items()}, os.path.join(out, "model_state.pdparams"))
    return str(out)


@pytest.mark.parametrize("safetensors, backbone", [(False, "model."), (True, "model."), (False, "qwen2.")])
def test_a_paddlenlp_score_model_loads_with_its_score_head(tiny_reward_model_dir, tmp_path, caplog, monkeypatch,
                                                          safetensors, backbone):
    """PaddleNLP's AutoModelForScore checkpoint: with PaddleNLP's class when installed, else read into a ValueModel;
    the same weights as the reward model it was made of, so the same values bit for bit (PaddleNLP's forward on
    both sides: PADDLE_GRPO_FAST=0)."""
    from paddle_grpo.policy.critic import SCORE_MODEL, paddlenlp_score_model

    monkeypatch.setenv("PADDLE_GRPO_FAST", "0")
    path = _score_layout(tiny_reward_model_dir, tmp_path / "score", safetensors, backbone)
    with caplog.at_level(logging.INFO, logger="paddle_grpo.policy"):
        critic = load_critic(path)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("critic:")]
    assert len(lines) == 1 and "is a PaddleNLP score model (AutoModelForScore)" in lines[0], lines
    assert critic.kind == SCORE_MODEL
    if paddlenlp_score_model() is None:
        assert "read without PaddleNLP's class" in lines[0]
    reward = load_critic(tiny_reward_model_dir)
    np.testing.assert_array_equal(critic.head.weight.numpy(), reward.head.weight.numpy())
    args = _tensors(*_batch())
    with paddle.no_grad():
        np.testing.assert_array_equal(critic.values(*args).numpy(), reward.values(*args).numpy())
    # saved by paddle_grpo, it is a critic checkpoint of its own
    again = load_critic(critic.save(str(tmp_path / "saved")))
    assert again.kind == CRITIC
    with paddle.no_grad():
        np.testing.assert_array_equal(again.values(*args).numpy(), reward.values(*args).numpy())


def test_a_score_model_with_other_keys_or_scores_is_refused(tiny_reward_model_dir, tmp_path):
    from paddle_grpo.policy.critic import paddlenlp_score_model

    if paddlenlp_score_model() is not None:
        pytest.skip("this PaddleNLP has AutoModelForScore: it loads its own checkpoints")
    path = _score_layout(tiny_reward_model_dir, tmp_path / "score")
    state = paddle.load(os.path.join(path, "model_state.pdparams"))
    state["score_head.weight"] = paddle.zeros([32, 2])  # two scores (score_dim 2)
    state["extra.weight"] = paddle.zeros([1])
    paddle.save(state, os.path.join(path, "model_state.pdparams"))
    with pytest.raises(ValueError, match=r"not an AutoModelForScore checkpoint with one score .* score_head.weight "
                                         r"is \[32, 2\]; unexpected keys \['extra.weight'\]"):
        load_critic(path)


# ----------------------------------------------------------------------------------------------------- values

def test_values_are_the_backbone_hidden_states_times_the_head(reward_critic, tiny_reward_model_dir):
    """Each row alone and unpadded through PaddleNLP's Qwen2Model called directly (default positions, no mask), its
    final hidden state at prompt length - 1 + t times the reward model's score weight (both read from the files)."""
    from paddlenlp.transformers import AutoModel

    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    with paddle.no_grad():
        got = reward_critic.values(*_tensors(prompt_ids, prompt_mask, completion_ids, completion_mask)).numpy()
    backbone = AutoModel.from_pretrained(tiny_reward_model_dir, dtype="float32")
    backbone.eval()
    head = _file_state(tiny_reward_model_dir)["score.weight"]
    checked = 0
    for i in range(len(prompt_ids)):
        prompt = prompt_ids[i][prompt_mask[i] == 1]
        completion = completion_ids[i][completion_mask[i] == 1]
        with paddle.no_grad():
            hidden = backbone(input_ids=paddle.to_tensor(np.concatenate([prompt, completion])[None]),
                              return_dict=True).last_hidden_state.numpy()[0]
        expected = hidden[len(prompt) - 1:len(prompt) - 1 + len(completion)] @ head[:, 0]
        tol = _value_tol(np.abs(hidden).max(), head)
        np.testing.assert_allclose(got[i, :len(completion)], expected, rtol=0, atol=tol)
        # the positions matter: one position off is far outside the tolerance
        shifted = hidden[len(prompt):len(prompt) + len(completion)] @ head[:, 0]
        assert np.abs(shifted - expected).max() > 100 * tol
        checked += len(completion)
    assert checked == 9


def test_values_do_not_depend_on_the_batch(reward_critic):
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    with paddle.no_grad():
        together = reward_critic.values(*_tensors(prompt_ids, prompt_mask, completion_ids, completion_mask)).numpy()
        hidden_max = _hidden_abs_max(reward_critic, prompt_ids, completion_ids)
        for i in range(3):
            # alone, with its own padding only (the batch's padding removed)
            p, c = prompt_ids[i][prompt_mask[i] == 1], completion_ids[i][completion_mask[i] == 1]
            alone = reward_critic.values(*_tensors(p[None], np.ones([1, len(p)], "int64"), c[None],
                                                   np.ones([1, len(c)], "int64"))).numpy()[0]
            tol = _value_tol(hidden_max, reward_critic.head.weight.numpy())
            np.testing.assert_allclose(together[i, :len(c)], alone, rtol=0, atol=tol)


def test_gradient_flows_to_head_and_backbone(tiny_reward_model_dir):
    critic = load_critic(tiny_reward_model_dir)
    args = _tensors(*_batch())
    coeff = (np.random.default_rng(1).normal(size=(3, 4)) * _batch()[3]).astype("float32")
    (critic.values(*args) * paddle.to_tensor(coeff)).sum().backward()
    # d/dw sum_t c_t h_t . w = sum_t c_t h_t, with the hidden states of the same forward (same kernels)
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    mask = np.concatenate([prompt_mask, completion_mask], axis=1)
    with paddle.no_grad():
        hidden = critic.backbone(input_ids=paddle.to_tensor(np.concatenate([prompt_ids, completion_ids], axis=1)),
                                 attention_mask=paddle.to_tensor(mask),
                                 position_ids=paddle.to_tensor(np.maximum(np.cumsum(mask, axis=1) - 1, 0)),
                                 return_dict=True).last_hidden_state.numpy()[:, 4:-1]
    expected = np.einsum("kt,kth->h", coeff, hidden)
    # values ran the lean Qwen2 path, `hidden` PaddleNLP's forward: each hidden state within _value_tol's bound of the
    # other's, weighted by sum|c|; then a sum of 12 products per element, rounded in float32 by either side
    bound = np.abs(coeff).sum() * np.abs(hidden).max()
    np.testing.assert_allclose(critic.head.weight.grad.numpy()[:, 0], expected, rtol=0,
                               atol=f32_sum_tol(64, 1.0, depth=19) * bound + f32_sum_tol(12, bound))
    grads = {n: p.grad for n, p in critic.backbone.named_parameters()}
    assert all(g is not None and np.abs(g.numpy()).max() > 0 for g in grads.values()), \
        [n for n, g in grads.items() if g is None or not np.any(g.numpy())]


def test_the_lean_qwen2_path_equals_paddlenlps_forward(tiny_reward_model_dir, monkeypatch):
    """A plain Qwen2 critic runs fast_decoder (prompts shared by identical rows); PADDLE_GRPO_FAST=0 runs PaddleNLP's
    forward. Rows 0-2 share one prompt (a group of 3 samples), row 3 has another."""
    from paddle_grpo.policy import fast_decoder

    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    group = (np.repeat(prompt_ids[:1], 3, 0), np.repeat(prompt_mask[:1], 3, 0))
    args = (np.concatenate([group[0], prompt_ids[2:]]), np.concatenate([group[1], prompt_mask[2:]]),
            np.concatenate([completion_ids, completion_ids[:1]]), np.concatenate([completion_mask,
                                                                                  completion_mask[:1]]))
    coeff = (np.random.default_rng(2).normal(size=args[3].shape) * args[3]).astype("float32")
    results = []
    for switch in ("1", "0"):
        monkeypatch.setenv(fast_decoder.ENV_SWITCH, switch)
        critic = load_critic(tiny_reward_model_dir)
        assert fast_decoder.enabled_for(critic.model) is (switch == "1")
        values = critic.values(*_tensors(*args))
        (values * paddle.to_tensor(coeff)).sum().backward()
        results.append((values.numpy(), {n: p.grad.numpy() for n, p in critic.model.named_parameters()}))
    (fast, fast_grads), (slow, slow_grads) = results
    m = args[3].astype(bool)
    hidden_max = _hidden_abs_max(critic, args[0], args[2])
    np.testing.assert_allclose(fast[m], slow[m], rtol=0, atol=_value_tol(hidden_max, critic.head.weight.numpy()))
    # gradients: the backward pass doubles the depth; each element sums the contributions of the 14 weighted
    # positions, whose absolute values add up to at most 14 times the largest (taken as the gradient's largest)
    for name, grad in slow_grads.items():
        scale = np.abs(grad).max()
        np.testing.assert_allclose(fast_grads[name], grad, rtol=0, atol=2 * f32_sum_tol(64, 1.0, depth=19) * 14
                                   * max(scale, 1e-30), err_msg=name)


def test_recompute_and_low_precision_load_as_for_the_policy(tiny_reward_model_dir):
    plain, recomputed = load_critic(tiny_reward_model_dir), load_critic(tiny_reward_model_dir, recompute=True)
    assert recomputed.model.config.recompute and recomputed.backbone.enable_recompute
    assert not plain.model.config.recompute
    args = _tensors(*_batch())
    for critic in (plain, recomputed):
        critic.values(*args).sum().backward()
    for (n, p), q in zip(plain.model.named_parameters(), recomputed.model.parameters()):
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy(), err_msg=n)  # the same ops rerun
    # the precision plan's dtype reaches every weight (paddle's CPU build has no bfloat16 matmul to run it here)
    low = load_critic(tiny_reward_model_dir, dtype="bfloat16", trainable=False)
    assert {p.dtype for p in low.model.parameters()} == {paddle.bfloat16}


# ------------------------------------------------------------------------------------------------ hub and TP

HUB_LOAD = '''
import json, sys
import numpy as np, paddle
from paddle_grpo.policy import load_critic
hub, local = load_critic(sys.argv[1]), load_critic(sys.argv[2])
ids = paddle.to_tensor([[0, 5, 6], [7, 8, 9]]); mask = paddle.to_tensor([[0, 1, 1], [1, 1, 1]])
same = bool(np.array_equal(hub.values(ids, mask, ids, mask).numpy(), local.values(ids, mask, ids, mask).numpy()))
print(json.dumps(dict(kind=hub.kind, source=hub.source, same=same)))
'''


def test_a_hub_id_loads_from_a_populated_cache(reward_critic, tmp_path):
    home = tmp_path / "ppnlp"
    saved = reward_critic.save(str(tmp_path / "saved"))
    shutil.copytree(saved, home / "models" / HUB_ID)
    env = {k: v for k, v in os.environ.items() if k not in ("PPNLP_ENDPOINT", "AISTUDIO_BOS_OFFLINE")}
    # a cache hit never asks the server: the offline switch proves it
    env.update(PPNLP_HOME=str(home), AISTUDIO_BOS_OFFLINE="1",
               PYTHONPATH=os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", HUB_LOAD, HUB_ID, saved], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"kind": CRITIC, "source": str(home / "models" / HUB_ID), "same": True}


@pytest.fixture(scope="module")
def llama_critic_dir(tiny_llama_dir, tmp_path_factory):
    """The tiny Llama as a saved ValueModel critic with a random (nonzero) head."""
    critic = load_critic(tiny_llama_dir)
    critic.head.weight.set_value(np.random.default_rng(4).normal(0, 0.1, size=(32, 1)).astype("float32"))
    return critic.save(str(tmp_path_factory.mktemp("llama_critic")))


@pytest.fixture(scope="module")
def score_layout_dir(tiny_reward_model_dir, tmp_path_factory):
    """The tiny reward model in PaddleNLP's AutoModelForScore layout."""
    return _score_layout(tiny_reward_model_dir, tmp_path_factory.mktemp("score_layout") / "score")


@pytest.mark.e2e
@pytest.mark.parametrize("family", ["qwen2_sequence_classifier", pytest.param("llama_value_model", marks=SLOW_DIST),
                                    pytest.param("paddlenlp_score_layout", marks=SLOW_DIST)])
def test_tensor_parallel_2_values_and_gradients_equal_one_process(family, request, tmp_path):
    """2 gloo ranks (each half of every layer) against one process: 15-20 s each on 2 idle cores, 50 s while other
    test suites load them; the other families (the ValueModel paths) are opt-in (PADDLE_GRPO_SLOW_DIST=1)."""
    fixture = {"qwen2_sequence_classifier": "tiny_reward_model_dir", "llama_value_model": "llama_critic_dir",
               "paddlenlp_score_layout": "score_layout_dir"}[family]
    tiny_reward_model_dir = request.getfixturevalue(fixture)
    rng = np.random.default_rng(0)
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    coeff = rng.normal(size=completion_mask.shape).astype("float32")
    np.savez(tmp_path / "r_inputs.npz", prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
             completion_mask=completion_mask, coeff=coeff)
    run(launch(os.path.join(REPO, "tests", "workers", "tp_critic_worker.py"), tiny_reward_model_dir,
               tmp_path / "r.npz", tmp_path / "saved", log_dir=tmp_path / "log"), REPO)
    got = np.load(tmp_path / "r.npz")
    assert int(got["tp"]) == 2
    # the merged save holds the whole model, exactly the reward model's weights (split and merged, no arithmetic)
    saved, source = _file_state(tmp_path / "saved"), _file_state(tiny_reward_model_dir)
    if family == "paddlenlp_score_layout":  # saved as a ValueModel: the backbone's file, the head beside it
        source = {k[len("model."):]: v for k, v in source.items() if k.startswith("model.")}
    assert set(saved) == set(source)
    for name, value in source.items():
        np.testing.assert_array_equal(saved[name], value, err_msg=name)
    assert json.loads((tmp_path / "saved" / "config.json").read_text()).get("tensor_parallel_degree", 1) == 1
    critic = load_critic(tiny_reward_model_dir)
    args = _tensors(prompt_ids, prompt_mask, completion_ids, completion_mask)
    values = critic.values(*args)
    (values * paddle.to_tensor(coeff) * args[3].astype("float32")).sum().backward()
    m = completion_mask.astype(bool)
    hidden_max = _hidden_abs_max(critic, prompt_ids, completion_ids)
    tol = _value_tol(hidden_max, critic.head.weight.numpy())
    np.testing.assert_allclose(got["values"][m], values.numpy()[m], rtol=0, atol=tol)
    # the head is replicated: its gradient is the same on both ranks, bit for bit, and the single process's up to
    # the hidden states' rounding, summed over the 9 valid positions with |coeff| weights
    np.testing.assert_array_equal(got["head_grads"][0], got["head_grads"][1])
    head_grad = critic.head.weight.grad.numpy()
    np.testing.assert_allclose(got["head_grads"][0], head_grad, rtol=0,
                               atol=f32_sum_tol(64, 1.0, depth=19) * hidden_max * np.abs(coeff[m]).sum() * 2)
    # the backbone's gradient too: the final norm's (replicated) weight gets sum_t c_t w * xhat_t, xhat_t = h_t / g
    # the normalised state; each term carries the forward's relative error and as much again from the backward
    norm_grad, g = critic.backbone.norm.weight.grad.numpy(), critic.backbone.norm.weight.numpy()
    term_bound = np.abs(coeff[m]).sum() * np.abs(critic.head.weight.numpy()).max() * hidden_max / np.abs(g).min()
    np.testing.assert_allclose(got["norm_grad"], norm_grad, rtol=0,
                               atol=2 * f32_sum_tol(64, 1.0, depth=19) * term_bound)
    assert np.abs(norm_grad).max() > 1e-3


# ------------------------------------------------------------------------- a family without a sequence classifier

@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory, tiny_policy_dir):
    """A tiny random LlamaForCausalLM (PaddleNLP 3.0.0b4 has no LlamaForSequenceClassification) with the tiny
    policy's tokenizer, saved with save_pretrained."""
    from paddlenlp.transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    path = str(tmp_path_factory.mktemp("tiny_llama"))
    paddle.seed(0)
    config = LlamaConfig(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    LlamaForCausalLM(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_policy_dir).save_pretrained(path)
    return path


def test_a_llama_critic_is_a_value_model_that_saves_and_loads(tiny_llama_dir, tmp_path, caplog):
    from paddlenlp.transformers import AutoModel

    from paddle_grpo.policy.critic import VALUE_HEAD_FILE, ValueModel, sequence_classifier_class

    with caplog.at_level(logging.INFO, logger="paddle_grpo.policy"):
        critic = load_critic(tiny_llama_dir)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("critic:")]
    assert len(lines) == 1 and "is a causal LM (LlamaForCausalLM)" in lines[0] and "zeros" in lines[0], lines
    assert "as a ValueModel (PaddleNLP has no sequence classifier for this family)" in lines[0]
    assert sequence_classifier_class(critic.model.config) is None and isinstance(critic.model, ValueModel)
    assert critic.kind == CAUSAL_LM and not np.any(critic.head.weight.numpy())
    assert set(critic.state_dict()) == {"llama." + k for k in critic.backbone.state_dict()} | {"score.weight"}
    # a nonzero head, so that the values test something: against LlamaModel called directly on each unpadded row
    head = np.random.default_rng(3).normal(0, 0.1, size=(32, 1)).astype("float32")
    critic.head.weight.set_value(head)
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    with paddle.no_grad():
        got = critic.values(*_tensors(prompt_ids, prompt_mask, completion_ids, completion_mask)).numpy()
    reference = AutoModel.from_pretrained(tiny_llama_dir, dtype="float32")
    reference.eval()
    for i in range(3):
        prompt, completion = prompt_ids[i][prompt_mask[i] == 1], completion_ids[i][completion_mask[i] == 1]
        with paddle.no_grad():
            hidden = reference(input_ids=paddle.to_tensor(np.concatenate([prompt, completion])[None]),
                               return_dict=True).last_hidden_state.numpy()[0]
        expected = hidden[len(prompt) - 1:len(prompt) - 1 + len(completion)] @ head[:, 0]
        np.testing.assert_allclose(got[i, :len(completion)], expected, rtol=0,
                                   atol=_value_tol(np.abs(hidden).max(), head))
    out = critic.save(str(tmp_path / "llama_critic"))
    assert (tmp_path / "llama_critic" / VALUE_HEAD_FILE).is_file()
    assert (tmp_path / "llama_critic" / "tokenizer_config.json").is_file()
    again = load_critic(out)
    assert again.kind == CRITIC and isinstance(again.model, ValueModel)
    with paddle.no_grad():
        np.testing.assert_array_equal(again.values(*_tensors(prompt_ids, prompt_mask, completion_ids,
                                                             completion_mask)).numpy(), got)
    again.values(*_tensors(prompt_ids, prompt_mask, completion_ids, completion_mask)).sum().backward()
    assert all(p.grad is not None and np.any(p.grad.numpy()) for p in again.trainable_parameters())
    os.remove(tmp_path / "llama_critic" / VALUE_HEAD_FILE)
    with pytest.raises(FileNotFoundError, match="without its value head"):
        load_critic(out)


def test_a_saved_value_model_stays_one_where_a_sequence_classifier_exists(tiny_policy_dir, tmp_path):
    """A ValueModel critic of a family that has (or later gains) a PaddleNLP sequence classifier (here Qwen2) loads
    as the ValueModel it is, with its saved head, never as a classifier with a fresh `score`."""
    from paddlenlp.transformers import AutoModel

    from paddle_grpo.policy.critic import ValueModel

    head = paddle.nn.Linear(64, 1, bias_attr=False)
    head.weight.set_value(np.random.default_rng(5).normal(0, 0.1, size=(64, 1)).astype("float32"))
    model = ValueModel(AutoModel.from_pretrained(tiny_policy_dir, dtype="float32"), head)
    model.config.score_type = "critic"
    model.save_pretrained(str(tmp_path / "vm"))
    critic = load_critic(str(tmp_path / "vm"))
    assert critic.kind == CRITIC and isinstance(critic.model, ValueModel)
    np.testing.assert_array_equal(critic.head.weight.numpy(), head.weight.numpy())
