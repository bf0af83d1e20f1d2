"""generation_config.json may list several end ids (Llama 3, Qwen2.5): the rollout stops at each, not only at the
tokenizer's EOS that the trainer passes (Policy.with_end_ids)."""
import json
import shutil

import numpy as np
import paddle

from paddle_grpo.policy import load_policy, load_tokenizer


def greedy(policy, eos):
    ids = paddle.to_tensor([[5, 17, 42, 99]], dtype="int64")
    out = policy.generate(ids, paddle.ones_like(ids), num_samples=1, max_new_tokens=6, eos_token_ids=[eos],
                          pad_token_id=0, do_sample=False)
    return out.completion_ids.numpy()[0][:int(out.lengths[0])].tolist()


def test_the_rollout_stops_at_every_end_id_of_generation_config(tiny_policy_dir, tmp_path):
    eos = load_tokenizer(tiny_policy_dir).eos_token_id
    free = greedy(load_policy(tiny_policy_dir, trainable=False), eos)
    assert len(free) == 6 and eos not in free  # the tiny model runs to max_new_tokens
    second = free[2]  # the third greedy token becomes an end id: the rollout must stop there
    model = shutil.copytree(tiny_policy_dir, tmp_path / "model")
    with open(model / "generation_config.json", "w") as f:
        json.dump({"eos_token_id": [eos, second], "pad_token_id": 0}, f)
    policy = load_policy(str(model), trainable=False)
    assert policy.end_token_ids == tuple(sorted({eos, second}))
    stopped = greedy(policy, eos)
    assert stopped == free[:free.index(second) + 1]
    np.testing.assert_array_equal(policy.with_end_ids({"eos_token_ids": 7})["eos_token_ids"],
                                  sorted({7, eos, second}))
