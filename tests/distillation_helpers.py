"""Shared by the on-policy distillation tests (tests/step/test_distillation_runs.py, test_distillation_full_runs.py):
the prompts with a reward of 0, a sharpened copy of the tiny policy as teacher, the runs' YAML config, and the exact
reverse KL of the next token at the prompts."""
import numpy as np
import paddle
import pytest
import yaml

from paddle_grpo.config import load_config
from paddle_grpo.recipes.tiny import build_tiny_policy
from conftest import TINY_CORPUS
from resume_helpers import NAMES, name_prompts_dir, tiny_run

ZERO_REWARD = "def reward(prompts, completions, **kwargs):\n    return [0.0 for _ in completions]\n"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return name_prompts_dir(tmp_path_factory.mktemp("opd"), ZERO_REWARD)


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """The tiny policy (same tokenizer, same weights: seed 0) with its LM head scaled by 8: a sharpened copy, which
    a student can reach along one direction of its weights. (A second random tiny model would be nearly uniform as
    the student is: their KL, ~0.01 nats, is below the noise of a few dozen sampled tokens.)"""
    path = tmp_path_factory.mktemp("teacher")
    _, model = build_tiny_policy(str(path), TINY_CORPUS, vocab_size=320, seed=0)
    model.lm_head.weight.set_value(model.lm_head.weight * 8.0)
    model.save_pretrained(str(path))
    return str(path)


def yaml_cfg(tmp_path, workdir, policy_dir, **overrides):
    values = tiny_run(policy_dir, f"{workdir / 'rewards.py'}:reward", workdir / "train.jsonl", tmp_path / "out",
                      **{"max_dec_len": 6, **overrides})
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(values))
    return load_config(str(path), [])


def exact_reverse_kl(student, teacher, tokenizer):
    """KL(pi_s || pi_T) of the next token after each prompt, from the full distributions, averaged over prompts."""
    kls = []
    with paddle.no_grad():
        for name in NAMES:
            ids = paddle.to_tensor([tokenizer(f"<|im_start|>user\nWho is {name}?<|im_end|>\n<|im_start|>assistant\n")
                                    ["input_ids"]])
            ls, lt = (paddle.nn.functional.log_softmax(m(ids)[0][0, -1].astype("float64")) for m in (student, teacher))
            kls.append(float((paddle.exp(ls) * (ls - lt)).sum()))
    return float(np.mean(kls))
