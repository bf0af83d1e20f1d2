"""configs/ppo.yaml and configs/vapo.yaml are PaddleNLP's published PPO / VAPO files (../shared/paddlenlp_configs,
llm/config/qwen/ppo_argument.yaml and vapo_argument.yaml) with the same keys and values, except the paths, the
logging destinations, and the keys of ours they state explicitly (their defaults); configs/quickstart_ppo.yaml is
the quickstart task with a critic started from the quickstart policy."""
import pathlib

import pytest
import yaml

from paddle_grpo.config import FIELDS, load_config

REPO = pathlib.Path(__file__).resolve().parents[2]
PUBLISHED = REPO.parent / "shared" / "paddlenlp_configs"
# What a user of PaddleNLP's file changes to run it here (paths, logging), and PaddleNLP's wandb/server settings.
CHANGED = {"actor_model_name_or_path", "critic_model_name_or_path", "train_datasets", "eval_datasets", "output_dir",
           "report_to", "wandb_http_proxy", "reward_server"}
OURS = {"gamma": 1.0, "lam": 0.95, "lam_critic": 1.0, "vapo_alpha": 0.05, "positive_example_lm_coeff": 0.1}


@pytest.mark.parametrize("ours, theirs", [("ppo.yaml", "b9e5bd21_llm__config__qwen__ppo_argument.yaml"),
                                          ("vapo.yaml", "abe27227_llm__config__qwen__vapo_argument.yaml")])
def test_same_keys_and_values_as_paddlenlps_file(ours, theirs):
    if not (PUBLISHED / theirs).is_file():
        pytest.skip(f"{PUBLISHED / theirs} not found (only beside the project's own checkout)")
    mine = yaml.safe_load((REPO / "configs" / ours).read_text(encoding="utf-8"))
    published = yaml.safe_load((PUBLISHED / theirs).read_text(encoding="utf-8"))
    extra = {k: v for k, v in mine.items() if k not in published}
    assert all(k in OURS and OURS[k] == v or k == "reward_model_name_or_path" for k, v in extra.items()), extra
    changed = {k for k in published if k in mine and mine[k] != published[k]}
    assert changed <= CHANGED, changed - CHANGED
    assert set(published) - set(mine) <= {"wandb_http_proxy", "reward_server"}
    assert all(k in FIELDS for k in mine)
    cfg = load_config(REPO / "configs" / ours, device="cpu", warn=False)
    assert cfg.needs_critic and cfg.critic_model_name_or_path == cfg.actor_model_name_or_path


def test_quickstart_ppo_is_the_quickstart_with_a_critic_from_its_policy():
    base = yaml.safe_load((REPO / "configs" / "quickstart.yaml").read_text(encoding="utf-8"))
    ppo = yaml.safe_load((REPO / "configs" / "quickstart_ppo.yaml").read_text(encoding="utf-8"))
    same = ("actor_model_name_or_path", "build_actor_if_missing", "reward_funcs", "train_datasets", "eval_datasets",
            "max_prompt_len", "max_dec_len", "temperature", "eval_do_sample", "per_device_eval_batch_size")
    assert {k: ppo[k] for k in same} == {k: base[k] for k in same}
    assert ppo["rl_algorithm"] == "ppo" and ppo["critic_model_name_or_path"] == base["actor_model_name_or_path"]
    assert ppo["output_dir"] != base["output_dir"]
    cfg = load_config(REPO / "configs" / "quickstart_ppo.yaml", device="cpu", warn=False)
    assert cfg.needs_critic
