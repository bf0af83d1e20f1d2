"""A failing reward function versus one that returns None, the same through every path: RewardSet, the in-process
rewarder the trainer uses, a real reward server (raw JSON and RewardClient), and the trainer's
`train/reward_none_frac`.

Failing (raise, timeout) -> the sample's combined reward is None, with the reason in `errors`.
Returning None            -> the term is skipped: the combined reward is the weighted sum of the other terms.
"""
import json

import numpy as np
import pytest
import requests

from paddle_grpo.rewards import get_reward_fn
from paddle_grpo.rewards.client import InProcessRewarder, RewardClient, make_rewarder
from reward_server import create_app

# Two functions, weights 1 and 0.5. `judge` raises on prompts holding BOOM and hangs on HANG (until released);
# `abstain` returns None on prompts holding SKIP. Scores depend on the completion so a group has variance.
REWARD_FILE = '''
import threading

RELEASE = threading.Event()


def judge(prompts, completions, **kwargs):
    if any("BOOM" in p for p in prompts):
        raise ValueError("cannot judge a BOOM prompt")
    if any("HANG" in p for p in prompts):
        RELEASE.wait(30)
    return [float(len(c) % 3) for c in completions]


def abstain(prompts, completions, **kwargs):
    return [None if "SKIP" in p else 1.0 for p in prompts]
'''
WEIGHTS = [1.0, 0.5]
PROMPTS = ["q BOOM", "q SKIP", "q", "q SKIP BOOM"]
COMPLETIONS = ["abcd", "abcd", "abcd", "abcd"]  # judge would give len % 3 = 1.0
EXPECTED = {
    "score": [None, 1.0, 1.5, None],  # BOOM: None; SKIP: judge alone (1 * 1.0); else 1 * 1.0 + 0.5 * 1.0
    "scores_by_function": {"judge": [None, 1.0, 1.0, None], "abstain": [1.0, None, 1.0, None]},
    "errors": ["judge: ValueError: cannot judge a BOOM prompt", None, None,
               "judge: ValueError: cannot judge a BOOM prompt"],
}


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("rewards") / "failing_rewards.py"
    path.write_text(REWARD_FILE)
    yield path
    get_reward_fn(f"{path}:judge").__globals__["RELEASE"].set()  # lets the hung calls end


def spec(reward_file):
    return f"{reward_file}:judge,{reward_file}:abstain"


def as_dict(result, reward_file):
    """The result as the server's JSON fields, with the functions' names ('<file>:judge') shortened to 'judge'."""
    short = lambda name: name.replace(f"{reward_file}:", "")  # noqa: E731
    return {"score": result.scores, "scores_by_function": {short(k): v for k, v in result.scores_by_function.items()},
            "errors": [None if e is None else short(e) for e in result.errors]}


def test_in_process_rewarder(reward_file):
    # The trainer builds its in-process rewarder exactly like this (trainer.py, make_rewarder(False, ...)).
    rewarder = make_rewarder(False, reward_funcs=spec(reward_file), reward_weights=WEIGHTS)
    assert isinstance(rewarder, InProcessRewarder)
    assert as_dict(rewarder.score_detailed(PROMPTS, [""] * 4, COMPLETIONS), reward_file) == EXPECTED
    assert rewarder.score(PROMPTS, [""] * 4, COMPLETIONS) == EXPECTED["score"]


def test_real_server_reply_and_client(reward_file, serve, caplog):
    server = serve(create_app(spec(reward_file), weights=WEIGHTS))
    reply = requests.post(server.url + "/", json={"src": PROMPTS, "tgt": [""] * 4, "response": COMPLETIONS},
                          timeout=30)
    assert reply.status_code == 200
    body = reply.json()
    assert body["score"] == EXPECTED["score"]
    assert body["errors"] == [None if e is None else f"{reward_file}:{e}" for e in EXPECTED["errors"]]
    assert body["scores_by_function"] == {f"{reward_file}:{k}": v for k, v in EXPECTED["scores_by_function"].items()}
    assert '"score":[null,1.0,1.5,null]' in reply.text  # null on the wire, not 0 or a missing entry
    client = RewardClient(server.url, max_retries=0)
    caplog.clear()
    assert as_dict(client.score_detailed(PROMPTS, [""] * 4, COMPLETIONS), reward_file) == EXPECTED
    # The trainer's log names the failure too, not only the server's.
    client_lines = [r.getMessage() for r in caplog.records if r.name == "paddle_grpo.rewards.client"]
    assert len(client_lines) == 1 and client_lines[0].startswith(f"reward server {server.url} (request ")
    assert ("a reward function failed on 2 of 4 samples (their total reward is None); first: "
            f"{reward_file}:judge: ValueError: cannot judge a BOOM prompt") in client_lines[0]


def test_timeout_is_a_failure_in_process_and_on_the_server(reward_file, serve):
    prompts, completions = ["q HANG", "q SKIP"], ["abcd", "ab"]
    expected = {"score": [None, 2.0], "scores_by_function": {"judge": [None, 2.0], "abstain": [1.0, None]},
                "errors": ["judge: timed out after 0.3 s", None]}
    local = InProcessRewarder(spec(reward_file), weights=WEIGHTS, timeout_s=0.3)
    assert as_dict(local.score_detailed(prompts, ["", ""], completions), reward_file) == expected
    server = serve(create_app(spec(reward_file), weights=WEIGHTS, timeout_s=0.3))
    remote = RewardClient(server.url, max_retries=0).score_detailed(prompts, ["", ""], completions)
    assert as_dict(remote, reward_file) == expected


def test_every_term_none_gives_none_without_an_error(reward_file, serve):
    only_abstain = f"{reward_file}:abstain"
    local = InProcessRewarder(only_abstain).score_detailed(["q SKIP", "q"], ["", ""], ["a", "b"])
    server = serve(create_app(only_abstain))
    remote = RewardClient(server.url, max_retries=0).score_detailed(["q SKIP", "q"], ["", ""], ["a", "b"])
    for result in (local, remote):
        assert result.scores == [None, 1.0] and result.errors == [None, None]


# ---- the trainer: raised-exception samples are left out and counted in train/reward_none_frac -------------------

def write_prompts(path):
    # Four prompts and global_batch_size 4: every step scores all four, 4 samples each (rollout_n 4).
    rows = [{"src": f"<|im_start|>user\nWho is {name}?<|im_end|>\n<|im_start|>assistant\n", "tgt": "x"}
            for name in ("Ann BOOM", "Bob SKIP", "Cid", "Dan")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def check_step(trainer):
    metrics = trainer.train_step()
    b = trainer.batch
    prompt_ids, prompt_mask = b.prompt_ids.numpy(), b.prompt_mask.numpy()
    prompts = [trainer.tokenizer.decode(ids[mask == 1].tolist()) for ids, mask in zip(prompt_ids, prompt_mask)]
    boom = np.array(["BOOM" in p for p in prompts])
    skip = np.array(["SKIP" in p for p in prompts])
    assert len(prompts) == 16 and boom.sum() == 4 and skip.sum() == 4
    # 4 of 16 samples raised: left out, and counted.
    assert metrics["train/reward_none_frac"] == 0.25
    assert b.valid.tolist() == (~boom).tolist()
    # The others: judge's len % 3, plus 0.5 * abstain's 1.0 except on SKIP prompts, where abstain returned None.
    expected = np.array([len(t) % 3 for t in b.texts], dtype=np.float64) + np.where(skip, 0.0, 0.5)
    # integers plus 0 or 0.5: exact in float32 and float64; their mean of 12 values is one division
    np.testing.assert_allclose(b.rewards[~boom], expected[~boom])
    assert metrics["train/reward"] == pytest.approx(float(expected[~boom].mean()))
    assert np.isfinite(metrics["train/policy_loss"])


@pytest.fixture
def trainer_cfg(reward_file, tiny_policy_dir, tmp_path):
    from paddle_grpo.config import config_from_dict

    train = write_prompts(tmp_path / "train.jsonl")

    def make(**overrides):
        values = dict(actor_model_name_or_path=tiny_policy_dir, train_datasets=str(train),
                      output_dir=str(tmp_path / "out"), logging_dir=str(tmp_path / "out" / "vdl"),
                      max_prompt_len=32, max_dec_len=8, min_dec_len=1, max_length=40, global_batch_size=4,
                      rollout_n=4, per_device_train_batch_size=16, per_device_logprob_batch_size=16,
                      learning_rate=1e-3, max_steps=1, kl_coeff=0.0, save_strategy="no", disable_tqdm=True,
                      seed=3, temperature=1.0)
        values.update(overrides)
        return config_from_dict(values)

    return make


def test_trainer_in_process_counts_raised_samples_as_none(trainer_cfg, reward_file):
    from paddle_grpo.trainer import Trainer

    check_step(Trainer(trainer_cfg(use_rm_server=False, reward_funcs=spec(reward_file), reward_weights=WEIGHTS)))


def test_trainer_with_reward_server_counts_raised_samples_as_none(trainer_cfg, reward_file, serve):
    from paddle_grpo.trainer import Trainer

    server = serve(create_app(spec(reward_file), weights=WEIGHTS))
    check_step(Trainer(trainer_cfg(use_rm_server=True, reward_server=server.url, reward_server_max_retries=0)))
