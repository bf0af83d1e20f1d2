"""Configuration loading and validation (paddle_grpo/config/).

PaddleNLP's own grpo_argument.yaml and reinforce_plus_plus_argument.yaml are rebuilt here from the key table in
PADDLENLP_KEYS.md (values as PaddleNLP ships them) and must load unchanged.
"""
import ast
import json
import logging
import re

import pytest
import yaml

from paddle_grpo.config import (ALIASES, FIELDS, Config, ConfigError, config_from_dict, dump_config,
                                field_choices, load_config, parse_args)

PADDLENLP_GRPO_YAML = """\
# PaddleNLP llm/config/qwen/grpo_argument.yaml, keys and values as PADDLENLP_KEYS.md lists them
rl_algorithm: grpo
actor_model_name_or_path: Qwen/Qwen2.5-7B-Instruct-1M
reward_model_name_or_path: ""
use_rm_server: true
reward_server: http://127.0.0.1:8731
logging_dir: vdl_log
logging_steps: 1
output_dir: checkpoints/qwen_grpo
report_to: visualdl
wandb_http_proxy: ""
run_name: "qwen_grpo"
train_datasets: "ppo-kk/34567ppl/train.jsonl"
eval_datasets: "ppo-kk/5ppl/test.jsonl"
prompt_key: "src"
response_key: "tgt"
dataloader_drop_last: true
dataloader_shuffle: false
balance_batch: true
use_remove_padding: true
tensor_parallel_degree: 2
sequence_parallel: true
sharding_parallel_degree: -1
sharding: "stage1"
sharding_parallel_config: "enable_release_grads"
pipeline_parallel_degree: 1
virtual_pp_degree: 1
rollout_tensor_parallel_degree: -1
max_prompt_len: 512
max_dec_len: 4096
min_dec_len: 32
top_p: 1.0
temperature: 0.7
repetition_penalty: 1.0
rollout_max_num_seqs: 32
rollout_quant_type: ""
do_train: true
seed: 42
global_batch_size: 8
global_gen_batch_size: -1
global_mini_batch_size: -1
rollout_n: 8
update_iters: 1
per_device_logprob_batch_size: 8
per_device_reward_batch_size: 8
per_device_value_batch_size: 8
per_device_train_batch_size: 8
num_train_epochs: 6
max_length: 4608
learning_rate: 5e-7
lr_scheduler_type: "constant"
weight_decay: 1e-2
adam_beta1: 0.9
adam_beta2: 0.999
adam_epsilon: 1e-8
max_grad_norm: 1.0
max_steps: 3600
save_steps: 300
save_strategy: "steps"
ignore_save_lr_and_optim: true
disable_tqdm: true
kl_coeff: 0.001
kl_loss_coeff: 0.000
pg_loss_coeff: 1.0
entropy_coeff: 0.0
clip_range_ratio: 0.2
clip_range_ratio_low: 0.2
clip_range_ratio_high: 0.2
clip_range_score: 10.0
enable_overlong_reward_buffer: false
overlong_reward_buffer: 256
overlong_penalty_factor: 1.0
clip_range_value: 5.0
normalize_reward: false
normalize_advantage: false
dynamic_sampling: false
max_gen_batches: 2
use_fp32_compute: true
do_eval: true
per_device_eval_batch_size: 32
evaluation_strategy: "steps"
eval_steps: 20
use_flash_attention: true
use_fused_rms_norm: false
use_fused_rope: false
use_fused_head_and_loss_fn: true
use_fused_linear: true
recompute: true
recompute_use_reentrant: true
recompute_granularity: "full"
bf16: true
fp16_opt_level: "O2"
amp_master_grad: false
amp_custom_black_list: ["reduce_sum", "softmax_with_cross_entropy", "c_softmax_with_cross_entropy", "elementwise_div", "sin", "cos"]
amp_custom_white_list: ["lookup_table", "lookup_table_v2", "flash_attn", "matmul", "matmul_v2", "fused_gemm_epilogue"]
offload_level: "freeze_model"
release_grads: true
offload_optim: false
skip_profile_timer: false
"""

# Keys PaddleNLP's file sets that have no effect on a CPU run here, each to be named in a warning.
EXPECTED_INERT_ON_CPU = {
    "sequence_parallel", "use_flash_attention",
    "use_fused_linear", "bf16", "fp16_opt_level", "amp_custom_black_list", "amp_custom_white_list", "offload_level",
    "release_grads", "kl_coeff",
}
# skip_profile_timer: false (keep timers) is what happens here anyway, so it is not reported. kl_coeff: 0.001 has
# no effect with rl_algorithm grpo (as in PaddleNLP) on every device.
# sequence_parallel: not implemented on any device (precision.NOT_IMPLEMENTED). use_fused_head_and_loss_fn: the
# chunked LM head, on every device (policy/lm_head.py).
EXPECTED_INERT_ON_GPU = {"offload_level", "release_grads", "kl_coeff", "sequence_parallel"}


def write(tmp_path, text, name="cfg.yaml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_of(tmp_path, text, overrides=()):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, text), overrides, device="cpu")
    return str(e.value)


def warned_keys(caplog):
    return {re.search(r"key '(\w+)'", r.getMessage()).group(1) for r in caplog.records
            if r.name == "paddle_grpo.config"}


# ------------------------------------------------------------------------------------------------ PaddleNLP files

def test_paddlenlp_grpo_yaml_loads_unchanged_with_its_values(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="paddle_grpo.config"):
        cfg = load_config(write(tmp_path, PADDLENLP_GRPO_YAML), device="cpu")
    expected = yaml.safe_load(PADDLENLP_GRPO_YAML)
    for key, value in expected.items():
        got = getattr(cfg, key)
        if key in ("learning_rate", "weight_decay", "adam_epsilon"):
            # YAML 1.1 reads `5e-7` without a dot as a string; the config must still give the float.
            assert isinstance(got, float) and got == float(value), key
        else:
            assert got == value, key
    assert cfg.eps_low == 0.2 and cfg.eps_high == 0.2
    assert cfg.mini_batch_prompts == 8
    assert warned_keys(caplog) == EXPECTED_INERT_ON_CPU
    # Each warning is one line naming file, line number and key.
    first = next(r.getMessage() for r in caplog.records if "'bf16'" in r.getMessage())
    bf16_line = PADDLENLP_GRPO_YAML.splitlines().index("bf16: true") + 1
    assert first.startswith(f"{tmp_path / 'cfg.yaml'}:{bf16_line}: key 'bf16' has no effect here")
    assert "\n" not in first


def test_paddlenlp_yaml_on_gpu_warns_only_about_keys_without_effect_on_gpu(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="paddle_grpo.config"):
        load_config(write(tmp_path, PADDLENLP_GRPO_YAML), device="gpu")
    assert warned_keys(caplog) == EXPECTED_INERT_ON_GPU


def test_paddlenlp_reinforce_plus_plus_yaml_loads(tmp_path):
    text = PADDLENLP_GRPO_YAML.replace("rl_algorithm: grpo", "rl_algorithm: reinforce_plus_plus")
    cfg = load_config(write(tmp_path, text), device="cpu", warn=False)
    assert cfg.rl_algorithm == "reinforce_plus_plus" and cfg.kl_coeff == 0.001


# The reward's KL keys: kl_coeff has no effect with the group estimators unless use_kl_in_reward.
@pytest.mark.parametrize("lines, noted", [
    ("rl_algorithm: grpo\nkl_coeff: 0.001", ["kl_coeff"]),
    ("rl_algorithm: rloo\nkl_coeff: 0.01", ["kl_coeff"]),
    ("rl_algorithm: grpo\nkl_coeff: 0.0", []),
    ("rl_algorithm: grpo", []),  # the default kl_coeff is not "set": no note
    ("rl_algorithm: grpo\nkl_coeff: 0.001\nuse_kl_in_reward: true", []),
    ("rl_algorithm: grpo\nkl_coeff: 0.0\nuse_kl_in_reward: true", ["use_kl_in_reward"]),
    ("rl_algorithm: reinforce_plus_plus\nkl_coeff: 0.001", []),
    ("rl_algorithm: reinforce_plus_plus\nkl_coeff: 0.001\nuse_kl_in_reward: true", ["use_kl_in_reward"]),
    # ppo / vapo: PaddleNLP's per-token KL reward (kl_token_rewards) always takes kl_coeff
    ("rl_algorithm: ppo\ncritic_model_name_or_path: c\nkl_coeff: 0.001", []),
    ("rl_algorithm: vapo\ncritic_model_name_or_path: c\nkl_coeff: 0.001\nuse_kl_in_reward: true",
     ["use_kl_in_reward"]),
])
def test_a_reward_kl_key_without_effect_gets_a_one_line_note(tmp_path, caplog, lines, noted):
    text = "actor_model_name_or_path: m\ntrain_datasets: d\nuse_rm_server: false\nreward_funcs: kk\n" + lines
    with caplog.at_level(logging.WARNING, logger="paddle_grpo.config"):
        cfg = load_config(write(tmp_path, text), device="gpu")
    assert sorted(warned_keys(caplog)) == noted
    for message in (r.getMessage() for r in caplog.records):
        assert "\n" not in message and message.startswith(f"{tmp_path / 'cfg.yaml'}:")
        assert "has no effect here" in message
    if noted == ["kl_coeff"]:
        assert cfg.reward_kl_coeff == 0.0 and not cfg.needs_reference_model
        assert "use_kl_in_reward: true" in caplog.records[0].getMessage()
        line = text.splitlines().index(next(x for x in text.splitlines() if x.startswith("kl_coeff"))) + 1
        assert caplog.records[0].getMessage().startswith(f"{tmp_path / 'cfg.yaml'}:{line}: key 'kl_coeff'")


def test_every_key_of_paddlenlp_keys_md_is_accepted(repo_root):
    doc = repo_root.parent / "shared" / "PADDLENLP_KEYS.md"
    if not doc.is_file():
        pytest.skip(f"{doc} not found (only beside the project's own checkout)")
    text = doc.read_text(encoding="utf-8")
    table = [line for line in text.splitlines() if line.startswith("| ") and "`" in line]
    keys = {m for line in table for m in re.findall(r"`(\w+)(?::[^`]*)?`", line)}
    keys |= set(re.findall(r"`(\w+)`", text.split("Older PaddleNLP configs")[1].split("\n\n")[0]))
    assert len(keys) > 90
    missing = sorted(k for k in keys if k not in FIELDS and k not in ALIASES)
    assert missing == []


def test_shipped_configs_load_and_validate(repo_root):
    paths = sorted((repo_root / "configs").glob("*.yaml"))
    assert {p.name for p in paths} >= {"grpo.yaml", "reinforce_plus_plus.yaml"}
    for path in paths:
        cfg = load_config(path, device="cpu", warn=False)
        assert isinstance(cfg, Config), path
    grpo = load_config(repo_root / "configs" / "grpo.yaml", device="cpu", warn=False)
    rpp = load_config(repo_root / "configs" / "reinforce_plus_plus.yaml", device="cpu", warn=False)
    assert (grpo.rl_algorithm, rpp.rl_algorithm) == ("grpo", "reinforce_plus_plus")
    assert grpo.use_rm_server and grpo.reward_server == "http://127.0.0.1:8731"
    # PaddleNLP's 4-GPU launch: 4 processes, tensor parallel 2 -> 2 data ranks, 32 sequences each, 4 micro-batches.
    geo = grpo.batch_geometry(world_size=4)
    assert (geo.data_parallel_degree, geo.prompts_per_rank, geo.sequences_per_rank, geo.grad_accum_steps) == \
        (2, 4, 32, 4)


def test_old_alias_keys_load_as_the_new_key(tmp_path):
    cfg = load_config(write(tmp_path, "mini_batch_size: 4\nquant_type: weight_only_int8\n"
                                      "per_device_rollout_batch_size: 16\nnum_return_sequences: 4\n"),
                      device="cpu", warn=False)
    assert (cfg.global_mini_batch_size, cfg.rollout_quant_type, cfg.rollout_max_num_seqs, cfg.rollout_n) == \
        (4, "weight_only_int8", 16, 4)


def test_json_config_file(tmp_path):
    path = write(tmp_path, json.dumps({"rl_algorithm": "rloo", "rollout_n": 4, "learning_rate": 1e-6}), "c.json")
    cfg = load_config(path, device="cpu")
    assert (cfg.rl_algorithm, cfg.rollout_n, cfg.learning_rate) == ("rloo", 4, 1e-6)


# ------------------------------------------------------------------------------------------- command line

def test_command_line_overrides_the_file(tmp_path):
    path = write(tmp_path, "learning_rate: 1e-5\nrollout_n: 4\ndo_eval: false\n")
    cfg = parse_args([str(path), "--learning_rate", "3e-6", "--rollout_n=2", "--recompute", "1",
                      "--reward_weights", "1,0.5", "--reward_funcs", "kk,tag_format", "--use_rm_server", "false",
                      "--resume_from_checkpoint", "true"])
    assert cfg.learning_rate == 3e-6 and cfg.rollout_n == 2 and cfg.recompute is True
    assert cfg.reward_weights == [1.0, 0.5] and cfg.use_rm_server is False
    assert cfg.resume_from_checkpoint is True
    cfg = parse_args(["--resume_from_checkpoint", "out/checkpoint-4", "--use_rm_server", "false",
                      "--reward_funcs", "kk"])
    assert cfg.resume_from_checkpoint == "out/checkpoint-4"


@pytest.mark.parametrize("argv, message", [
    (["--rollout_n"], "command line: --rollout_n needs a value"),
    (["rollout_n", "3"], "command line: expected --key value, got 'rollout_n'"),
    (["--rollout_nn", "3"], "command line: unknown key 'rollout_nn' (did you mean 'rollout_n'?)"),
    (["--rollout_n", "many"], "command line: key 'rollout_n' expects an integer, got 'many' (str)"),
    (["--do_eval", "maybe"], "command line: key 'do_eval' expects true or false, got 'maybe' (str)"),
    (["--reward_weights", "1,x"], "command line: key 'reward_weights[1]' expects a number, got 'x' (str)"),
])
def test_command_line_errors(argv, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, argv, device="cpu")
    assert str(e.value) == message


# -------------------------------------------------------------------------------------------- bad input

def test_unknown_key_names_file_line_and_suggestion(tmp_path):
    msg = error_of(tmp_path, "rl_algorithm: grpo\n\nlearning_rat: 1e-6\n")
    assert msg == f"{tmp_path / 'cfg.yaml'}:3: unknown key 'learning_rat' (did you mean 'learning_rate'?)"
    msg = error_of(tmp_path, "zzzz_qqq: 1\n")
    assert msg.endswith("unknown key 'zzzz_qqq'")


def test_every_unknown_key_is_named_in_one_error(tmp_path):
    # three typos (two in the file, one on the command line) and a bad value: one run names all three typos, each
    # with its place and suggestion, before any value is converted
    path = tmp_path / "cfg.yaml"
    msg = error_of(tmp_path, "learning_rat: 1e-6\nseed: 1\nrollout_m: 4\nrollout_n: eight\n",
                   ["--max_step", "3"])
    assert msg == ("3 unknown keys:\n"
                   f"  {path}:1: unknown key 'learning_rat' (did you mean 'learning_rate'?)\n"
                   f"  {path}:3: unknown key 'rollout_m' (did you mean 'rollout_n'?)\n"
                   "  command line: unknown key 'max_step' (did you mean 'max_steps'?)")
    with pytest.raises(ConfigError, match=r"^2 unknown keys:\n  <dict>: unknown key 'sede' \(did you mean 'seed'"):
        config_from_dict({"sede": 1, "zzzz_qqq": 2})


def test_every_wrong_type_is_named_in_one_error(tmp_path):
    # three wrong types (two in the file, one on the command line): one run names all three, each as its own error
    # would; the out-of-range top_p is not checked before the types are right
    path = tmp_path / "cfg.yaml"
    msg = error_of(tmp_path, "learning_rate: abc\nseed: 1\nrollout_n: eight\ntop_p: 2\n", ["--do_eval", "3"])
    assert msg == ("3 bad values:\n"
                   f"  {path}:1: key 'learning_rate' expects a number, got 'abc' (str)\n"
                   f"  {path}:3: key 'rollout_n' expects an integer, got 'eight' (str)\n"
                   "  command line: key 'do_eval' expects true or false, got '3' (str)")
    with pytest.raises(ConfigError) as e:
        config_from_dict({"seed": "x", "reward_weights": [1, "y"]})
    assert str(e.value) == ("2 bad values:\n"
                            "  <dict>: key 'seed' expects an integer, got 'x' (str)\n"
                            "  <dict>: key 'reward_weights[1]' expects a number, got 'y' (str)")


def test_every_out_of_range_value_or_bad_choice_is_named_in_one_error(tmp_path):
    # once the types are right: one line per key (top_p's infinity is not also out of (0, 1]); min_dec_len >
    # max_dec_len, a combination, waits until they are fixed
    path = tmp_path / "cfg.yaml"
    text = "rollout_n: 0\nseed: 1\ntop_p: .inf\nlora_dropout: 1\nmax_dec_len: 8\nmax_length: 64\nloss_agg_mode: x\n"
    modes = ", ".join(repr(c) for c in field_choices(FIELDS["loss_agg_mode"]))
    assert error_of(tmp_path, text, ["--learning_rate", "-1"]) == (
        "5 bad values:\n"
        f"  {path}:7: key 'loss_agg_mode' = 'x': must be one of {modes}\n"
        f"  {path}:3: key 'top_p' = inf: must be a finite number\n"
        f"  {path}:1: key 'rollout_n' = 0: must be at least 1\n"
        "  command line: key 'learning_rate' = -1.0: must not be negative\n"
        f"  {path}:4: key 'lora_dropout' = 1.0: must be in [0, 1)")
    assert error_of(tmp_path, "seed: 1\nmax_dec_len: 8\nmax_length: 64\n") == (
        f"key 'min_dec_len' = 32 (the default): must not exceed max_dec_len (8, {path}:2); set min_dec_len to at "
        "most 8")


@pytest.mark.parametrize("line, expected", [
    ("rollout_n: eight", "key 'rollout_n' expects an integer, got 'eight' (str)"),
    ("rollout_n: 2.5", "key 'rollout_n' expects an integer, got 2.5 (float)"),
    ("learning_rate: fast", "key 'learning_rate' expects a number, got 'fast' (str)"),
    ("learning_rate: true", "key 'learning_rate' expects a number, got True (bool)"),
    ("do_eval: 3", "key 'do_eval' expects true or false, got 3 (int)"),
    ("amp_custom_black_list: {a: 1}", "key 'amp_custom_black_list' expects a list, got {'a': 1} (dict)"),
    ("run_name: [a, b]", "key 'run_name' expects a string, got ['a', 'b'] (list)"),
])
def test_wrong_type_names_key_and_value(tmp_path, line, expected):
    msg = error_of(tmp_path, "seed: 1\n" + line + "\n")
    assert msg == f"{tmp_path / 'cfg.yaml'}:2: {expected}"


@pytest.mark.parametrize("text, expected", [
    ("learning_rate: -1e-6", "key 'learning_rate' = -1e-06: must not be negative"),
    ("rollout_n: 0", "key 'rollout_n' = 0: must be at least 1"),
    ("clip_range_ratio: -0.1", "key 'clip_range_ratio' = -0.1: must not be negative"),
    ("clip_range_ratio_high: -0.2", "key 'clip_range_ratio_high' = -0.2: must not be negative"),
    ("clip_range_ratio_low: 1.0", "key 'clip_range_ratio_low' = 1.0: the lower clip range must be below 1"),
    ("clip_ratio_c: 1.0", "key 'clip_ratio_c' = 1.0: the dual-clip constant must be greater than 1"),
    ("top_p: 0", "key 'top_p' = 0.0: must be in (0, 1]"),
    ("top_k: -1", "key 'top_k' = -1: must not be negative"),
    ("temperature: 0", "key 'temperature' = 0.0: must be greater than 0"),
    ("kl_coeff: -0.1", "key 'kl_coeff' = -0.1: must not be negative"),
    ("rl_algorithm: ppo", "key 'critic_model_name_or_path' is empty: rl_algorithm 'ppo' trains a critic (value "
                          "model) (rl_algorithm: ppo); name its directory or hub ID"),
    ("gamma: 1.5", "key 'gamma' = 1.5: must be in [0, 1]"),
    ("lam: -0.1", "key 'lam' = -0.1: must be in [0, 1]"),
    ("lam_critic: 2", "key 'lam_critic' = 2.0: must be in [0, 1]"),
    ("vapo_alpha: 0", "key 'vapo_alpha' = 0.0: must be greater than 0"),
    ("positive_example_lm_coeff: -0.1", "key 'positive_example_lm_coeff' = -0.1: must not be negative"),
    ("per_device_value_batch_size: 0", "key 'per_device_value_batch_size' = 0: must be at least 1"),
    ("pretrain_critic_steps: -1", "key 'pretrain_critic_steps' = -1: must not be negative"),
    ("critic_warmup_ratio: 1", "key 'critic_warmup_ratio' = 1.0: must be in [0, 1)"),
    ("clip_range_value: -1", "key 'clip_range_value' = -1.0: must not be negative"),
    ("critic_lr_scheduler_type: step", "key 'critic_lr_scheduler_type' = 'step': must be one of 'constant'"),
    ("rl_algorithm: dpo", "key 'rl_algorithm' = 'dpo': is not supported: the supported algorithms are grpo, "),
    ("num_train_epochs: -1", "key 'num_train_epochs' = -1.0: must not be negative unless max_steps"),
    ("loss_agg_mode: mean", "key 'loss_agg_mode' = 'mean': must be one of 'token-mean'"),
    ("max_steps: 0", "key 'max_steps' = 0: must be -1 (from num_train_epochs) or at least 1"),
    ("global_mini_batch_size: 0", "key 'global_mini_batch_size' = 0: must be -1 (automatic) or at least 1"),
    ("adam_beta2: 1.0", "key 'adam_beta2' = 1.0: must be in [0, 1)"),
    ("learning_rate: .nan", "key 'learning_rate' = nan: must be a finite number"),
])
def test_out_of_range_values(tmp_path, text, expected):
    msg = error_of(tmp_path, "seed: 1\n" + text + "\n")
    assert msg.startswith(f"{tmp_path / 'cfg.yaml'}:2: {expected}")


@pytest.mark.parametrize("text, expected", [
    ("global_batch_size: 8\nglobal_mini_batch_size: 3",
     "key 'global_mini_batch_size' = 3: must divide global_batch_size (8, "),
    ("max_prompt_len: 512\nmax_dec_len: 1024\nmax_length: 1000",
     "key 'max_length' = 1000: must be at least max_prompt_len + max_dec_len = 512 + 1024 = 1536"),
    ("min_dec_len: 64\nmax_dec_len: 32\nmax_length: 1024", "key 'min_dec_len' = 64: must not exceed max_dec_len (32, "),
    ("use_rm_server: false", "key 'reward_funcs' = '' (the default): is empty while use_rm_server is false"),
    ("use_rm_server: false\nreward_funcs: kk,gsm8k\nreward_weights: [1.0]",
     "key 'reward_weights' = [1.0]: has 1 weights for 2 reward functions (kk,gsm8k)"),
    ("reward_weights: [1.0]", "key 'reward_weights' = [1.0]: applies to in-process reward functions"),
    ("rl_algorithm: rloo\nrollout_n: 1", "key 'rollout_n' = 1: rloo needs at least 2 samples per prompt"),
    ("reward_model_name_or_path: my/rm", "key 'reward_model_name_or_path' = 'my/rm': is set while use_rm_server is "
                                         "true: the reward server hosts the reward model"),
    ("use_rm_server: false\nreward_model_name_or_path: my/rm\nreward_funcs: kk\nreward_weights: [1.0]",
     "key 'reward_weights' = [1.0]: has 1 weights for 2 reward functions (kk, then the reward model, whose weight "
     "comes last)"),
    ("do_eval: true", "key 'eval_datasets' = '' (the default): is empty while do_eval is true"),
    ("use_rm_server: true\nreward_server: ''", "key 'reward_server' = '': is empty while use_rm_server is true"),
    ("global_gen_batch_size: 4", "key 'global_gen_batch_size' = 4: is smaller than global_batch_size (8, the default)"),
    ("enable_overlong_reward_buffer: true\nmax_dec_len: 128\nmax_length: 1024\noverlong_reward_buffer: 256",
     "key 'overlong_reward_buffer' = 256: must not exceed max_dec_len (128, "),
])
def test_inconsistent_combinations(tmp_path, text, expected):
    assert expected in error_of(tmp_path, text + "\n")


def test_a_combination_error_says_which_value_is_the_default_and_what_to_set(tmp_path):
    # min_dec_len is not in the file: its 32 is the default, max_dec_len's 8 comes from line 1
    path = tmp_path / "cfg.yaml"
    assert error_of(tmp_path, "max_dec_len: 8\nmax_length: 64\n") == (
        f"key 'min_dec_len' = 32 (the default): must not exceed max_dec_len (8, {path}:1); set min_dec_len to at "
        "most 8")
    assert error_of(tmp_path, "max_prompt_len: 4096\nmax_dec_len: 1024\n") == (
        "key 'max_length' = 4608 (the default): must be at least max_prompt_len + max_dec_len = 4096 + 1024 = "
        "5120; set max_length to 5120 or more")
    # 8 prompts split into mini-batches of 3: the largest divisor of 8 up to 3 is 2
    assert error_of(tmp_path, "global_batch_size: 8\nglobal_mini_batch_size: 3\n").endswith(
        "key 'global_mini_batch_size' = 3: must divide global_batch_size (8, "
        f"{path}:1): each rollout is split into whole mini-batches; set global_mini_batch_size to 2 (its divisors: "
        "1, 2, 4, 8; -1: one mini-batch)")


def test_per_device_train_batch_size_error_suggests_the_largest_divisor(repo_root):
    # the quickstart with --global_batch_size 4: 4 prompts x 8 samples = 32 sequences per mini-batch, which
    # per_device_train_batch_size 256 does not divide; 32 (the largest divisor of 32 up to 256) does
    cfg = load_config(repo_root / "configs" / "quickstart.yaml", ["--global_batch_size", "4"], device="cpu")
    with pytest.raises(ConfigError) as e:
        cfg.batch_geometry(1)
    assert str(e.value).endswith("x rollout_n (8) = 32; set per_device_train_batch_size to 32 (the largest divisor "
                                 "of 32 up to 256)")
    cfg = config_from_dict({"global_batch_size": 6, "rollout_n": 2, "per_device_train_batch_size": 8})
    with pytest.raises(ConfigError, match=r"= 12; set per_device_train_batch_size to 6 \(the largest divisor of 12 "
                                          r"up to 8\)$"):
        cfg.batch_geometry(1)
    # the suggested value works: 12 sequences in 2 micro-batches of 6
    assert config_from_dict({"global_batch_size": 6, "rollout_n": 2,
                             "per_device_train_batch_size": 6}).batch_geometry(1).grad_accum_steps == 2


def test_max_turns_1_with_tools_is_refused(tmp_path):
    # docs/tools.md: the last assistant turn's calls are recorded but never run; with max_turns 1 it is the only one
    path = tmp_path / "cfg.yaml"
    assert error_of(tmp_path, "use_rm_server: false\nreward_funcs: kk\ntools: [calculator]\nmax_turns: 1\n") == (
        f"{path}:4: key 'max_turns' = 1: with tools (calculator) no tool call could run: the last assistant turn "
        "ends the sample and its calls are not run, and with max_turns 1 the only turn is the last (docs/tools.md, "
        "The rollout); set max_turns to 2 or more (a call, then the answer that reads its result), or leave tools "
        "empty")
    assert config_from_dict({"tools": ["calculator"], "max_turns": 2}).max_turns == 2
    assert config_from_dict({"max_turns": 1}).max_turns == 1  # without tools the key has no effect


def test_combination_error_names_where_the_key_was_set(tmp_path):
    msg = error_of(tmp_path, "global_batch_size: 8\n", ["--global_mini_batch_size", "3"])
    assert msg.startswith("command line: key 'global_mini_batch_size' = 3")


def test_structural_file_errors(tmp_path):
    assert error_of(tmp_path, "- a\n- b\n").endswith("the top level must be a mapping of key: value, got a seq")
    assert "not valid YAML/JSON" in error_of(tmp_path, "a: [1,\n")
    assert error_of(tmp_path, "seed: 1\nrollout_n: 2\nseed: 3\n") == \
        f"{tmp_path / 'cfg.yaml'}:3: key 'seed' appears twice (first on line 1)"
    with pytest.raises(ConfigError, match="config file not found: .*nope.yaml"):
        load_config(tmp_path / "nope.yaml")
    assert load_config(write(tmp_path, "# only a comment\n"), device="cpu") == Config()


# ----------------------------------------------------------------------------------------- batch geometry

def test_batch_geometry_hand_computed():
    cfg = config_from_dict({"global_batch_size": 16, "global_mini_batch_size": 8, "rollout_n": 4,
                            "per_device_train_batch_size": 4, "update_iters": 2})
    geo = cfg.batch_geometry(world_size=2)
    # 2 data ranks: 8 prompts x 4 samples = 32 sequences per rank; mini-batch 8 prompts -> 4 per rank x 4 = 16
    # sequences -> 4 micro-batches of 4; 16/8 = 2 mini-batches per pass, 2 passes -> 4 optimizer steps.
    assert (geo.data_parallel_degree, geo.prompts_per_rank, geo.sequences_per_rank, geo.mini_batches_per_rollout,
            geo.sequences_per_mini_batch, geo.grad_accum_steps, geo.optimizer_steps_per_step) == \
        (2, 8, 32, 2, 16, 4, 4)


@pytest.mark.parametrize("values, world, expected", [
    ({"tensor_parallel_degree": 2}, 1, "tensor_parallel_degree (2) x pipeline_parallel_degree (1) = 2 does not "
                                       "divide the number of processes (1)"),
    ({"global_batch_size": 6, "per_device_train_batch_size": 1}, 4,
     "global_batch_size (6) must be divisible by the data-parallel degree 4"),
    ({"global_batch_size": 8, "rollout_n": 3, "per_device_train_batch_size": 8}, 2,
     "per_device_train_batch_size (8) must divide the sequences of one mini-batch on one rank: global_mini_batch_size"
     " (8) / data-parallel degree (2) x rollout_n (3) = 12"),
    ({"sharding_parallel_degree": 3}, 4, "sharding_parallel_degree (3) does not divide the data-parallel degree 4"),
])
def test_batch_geometry_errors_name_the_keys(values, world, expected):
    cfg = config_from_dict(values)
    with pytest.raises(ConfigError) as e:
        cfg.batch_geometry(world_size=world)
    assert str(e.value).startswith(expected)


# ------------------------------------------------------------------------------------------------ output

def test_printed_config_round_trips_and_hides_the_token(tmp_path):
    cfg = config_from_dict({"rl_algorithm": "reinforce_plus_plus", "learning_rate": 2e-6,
                            "amp_custom_black_list": ["a", "b"], "run_name": "x: {y}",
                            "reward_server_token": "s3cret", "clip_ratio_c": 3.0})
    text = cfg.format()
    assert "s3cret" not in text and "reward_server_token: '***'" in text
    reloaded = load_config(write(tmp_path, text.replace("'***'", "s3cret")), device="cpu")
    assert reloaded == cfg
    dump_config(cfg, tmp_path / "resolved.json")
    data = json.loads((tmp_path / "resolved.json").read_text())
    assert data["reward_server_token"] == "***" and data["learning_rate"] == 2e-6
    dump_config(cfg, tmp_path / "resolved.yaml")
    assert (tmp_path / "resolved.yaml").read_text() == text


def test_algorithm_choices_are_the_registries(repo_root):
    from paddle_grpo import algorithms
    assert field_choices(FIELDS["rl_algorithm"]) == algorithms.available_advantage_estimators()
    assert field_choices(FIELDS["importance_sampling_level"]) == ("token", "sequence")
    assert field_choices(FIELDS["kl_estimator"]) == field_choices(FIELDS["kl_loss_estimator"]) == ("k1", "k2", "k3")
    assert field_choices(FIELDS["loss_agg_mode"]) == algorithms.LOSS_AGG_MODES
    # No list of names is kept in config/ itself (help texts may name an estimator, as use_kl_in_reward's does).
    files = sorted((repo_root / "paddle_grpo" / "config").glob("*.py"))
    assert len(files) > 10  # the package's files, not an empty glob
    tree = ast.Module(body=[n for f in files for n in ast.parse(f.read_text(encoding="utf-8")).body], type_ignores=[])
    prose = {id(c.args[1]) for c in ast.walk(tree) if isinstance(c, ast.Call) and getattr(c.func, "id", "") == "arg"
             and len(c.args) > 1} | {id(e.value) for e in ast.walk(tree) if isinstance(e, ast.Expr)}  # docstrings
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
               and id(n) not in prose]
    for name in ("reinforce_plus_plus", "rloo", "seq-mean-token-mean", "gspo"):
        assert not any(name in x for x in strings), name
    assert "k2" not in strings


def test_a_registered_estimator_is_a_valid_rl_algorithm_with_its_min_group_size():
    from paddle_grpo.algorithms import register_advantage_estimator, unregister_advantage_estimator

    @register_advantage_estimator("test_triplets", min_group_size=3)
    def triplets(token_level_rewards, response_mask, index):
        return response_mask, response_mask

    try:
        assert config_from_dict({"rl_algorithm": "test_triplets", "rollout_n": 3}).rl_algorithm == "test_triplets"
        with pytest.raises(ConfigError, match="key 'rollout_n' = 2: test_triplets needs at least 3 samples per "
                                              "prompt"):
            config_from_dict({"rl_algorithm": "test_triplets", "rollout_n": 2})
    finally:
        unregister_advantage_estimator("test_triplets")
    with pytest.raises(ConfigError, match="key 'rl_algorithm' = 'test_triplets': is not supported: the supported algorithms are grpo,"):
        config_from_dict({"rl_algorithm": "test_triplets", "rollout_n": 3})


def test_an_estimator_option_that_is_not_a_config_key_is_an_error():
    from paddle_grpo.algorithms import register_advantage_estimator, unregister_advantage_estimator

    @register_advantage_estimator("test_tempered", config_options=("temperature", "tempering"))
    def tempered(token_level_rewards, response_mask, index, temperature=1.0, tempering=1.0):
        return response_mask, response_mask

    try:
        with pytest.raises(ConfigError, match="key 'rl_algorithm' = 'test_tempered': the estimator takes config "
                                              "option 'tempering', which is not a config key"):
            config_from_dict({"rl_algorithm": "test_tempered"})
    finally:
        unregister_advantage_estimator("test_tempered")


def test_a_registered_importance_sampling_level_is_a_valid_choice():
    from paddle_grpo.algorithms import get_policy_loss, register_policy_loss, unregister_policy_loss

    register_policy_loss("test_vanilla_copy", importance_sampling_level="test_level")(get_policy_loss("vanilla"))
    try:
        assert config_from_dict({"importance_sampling_level": "test_level"}).importance_sampling_level == \
            "test_level"
    finally:
        unregister_policy_loss("test_vanilla_copy")
    with pytest.raises(ConfigError, match="must be one of 'token', 'sequence'"):
        config_from_dict({"importance_sampling_level": "test_level"})


def test_every_field_has_help_and_a_valid_default():
    for name, f in FIELDS.items():
        assert f.metadata["help"], name
    Config()  # defaults validate
    from paddle_grpo.config import validate
    validate(Config())


def test_configuration_doc_is_generated_from_the_fields_and_current(repo_root):
    import importlib.util
    spec = importlib.util.spec_from_file_location("gen_config_doc", repo_root / "tools" / "gen_config_doc.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.main(["--check"]) == 0, "docs/configuration.md is stale: run python tools/gen_config_doc.py"
    doc = (repo_root / "docs" / "configuration.md").read_text(encoding="utf-8")
    missing = [k for k in FIELDS if f"| `{k}` |" not in doc]
    assert missing == []
    # a pipe inside a cell is escaped (GitHub's tables show `\|` as `|`, in code spans too), not replaced: the
    # chat_template row shows Qwen's marker as it is; and every table row still has its 5 cells
    assert "`<\\|im_start\\|>`" in doc and "</im_start/>" not in doc
    for row in (line for line in doc.splitlines() if line.startswith("| `")):
        assert len(re.split(r"(?<!\\)\|", row)) == 7, row  # 5 cells between 6 unescaped pipes


def test_help_texts_cite_no_issue_numbers(repo_root):
    # user-facing text says what and why, not which tracker entry: config help, argparse help of tools/, and
    # run_rl.py's usage
    texts = {f"config key {k}": f.metadata["help"] for k, f in FIELDS.items()}
    texts.update({f"effect of {k}": e.note for k, f in FIELDS.items() for e in f.metadata["effect"].values()})
    for path in [repo_root / "run_rl.py", *sorted((repo_root / "tools").rglob("*.py"))]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        texts[f"{path.name} docstring"] = ast.get_docstring(tree) or ""
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg in ("help", "description", "epilog"):
                texts[f"{path.name} {node.arg} at line {node.value.lineno}"] = ast.unparse(node.value)
    cited = {where: text for where, text in texts.items() if re.search(r"\bissues?\b\s*#?\d", text, re.I)}
    assert cited == {}


def test_sharding_parallel_config_options_are_checked_and_explained(tmp_path, caplog):
    with pytest.raises(ConfigError, match=r"key 'sharding_parallel_config' = 'enable_release_grad'.*unknown option "
                                          r"'enable_release_grad'; the options are disable_stage1_reduce_avg"):
        load_config(write(tmp_path, "sharding: stage1\nsharding_parallel_config: enable_release_grad\n"), device="cpu")
    with caplog.at_level(logging.WARNING, logger="paddle_grpo.config"):
        cfg = load_config(write(tmp_path, "sharding: stage1\nsharding_parallel_config: "
                                          "enable_release_grads,enable_stage1_overlap\n"), device="gpu")
    assert cfg.sharding_parallel_config == "enable_release_grads,enable_stage1_overlap"
    lines = [r.getMessage() for r in caplog.records]
    # enable_release_grads is what the trainer does anyway: no warning; the overlap option does nothing here.
    assert len(lines) == 1 and lines[0].startswith(f"{tmp_path / 'cfg.yaml'}:2: key 'sharding_parallel_config': "
                                                   "option 'enable_stage1_overlap' has no effect here")


# ------------------------------------------------------------------------------- PaddleNLP drop-in (issue 14)

def test_fused_linear_is_the_old_name_of_use_fused_linear():
    assert config_from_dict({"fused_linear": True}).use_fused_linear is True
    assert config_from_dict({"fused_linear": "false"}).use_fused_linear is False


@pytest.mark.parametrize("logger_name", ["wandb", "tensorboard"])
def test_report_to_wandb_or_tensorboard_is_one_warning_line(tmp_path, caplog, logger_name):
    with caplog.at_level(logging.WARNING, logger="paddle_grpo.config"):
        cfg = load_config(write(tmp_path, f"report_to: {logger_name}\nkl_coeff: 0\n"), device="cpu")
    assert cfg.report_to == logger_name
    lines = [r.getMessage() for r in caplog.records if r.name == "paddle_grpo.config"]
    assert lines == [f"{tmp_path / 'cfg.yaml'}:1: report_to '{logger_name}' is not available here; metrics go to "
                     "VisualDL (logging_dir) and metrics.jsonl instead"]


def test_max_steps_overrides_num_train_epochs_minus_one():
    cfg = config_from_dict({"num_train_epochs": -1, "max_steps": 3600})
    assert (cfg.num_train_epochs, cfg.max_steps) == (-1.0, 3600)
    with pytest.raises(ConfigError, match="key 'num_train_epochs' = -1.0: must not be negative unless max_steps"):
        config_from_dict({"num_train_epochs": -1})


def test_sharding_stage2_runs_as_stage1_with_a_warning_on_every_device(tmp_path, caplog):
    for device in ("cpu", "gpu"):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="paddle_grpo.config"):
            load_config(write(tmp_path, "sharding: stage2\nkl_coeff: 0\n"), device=device)
        (line,) = [r.getMessage() for r in caplog.records if r.name == "paddle_grpo.config"]
        assert "sharding 'stage2' runs as stage1" in line and "shard the gradients" in line
        assert "not implemented here" in line


CRITIC_KEYS_TEXT = ("rl_algorithm: vapo\ncritic_model_name_or_path: Qwen/Qwen2.5-1.5B-Instruct\n"
                    "critic_learning_rate: 1e-5\ncritic_min_learning_rate: 1e-5\ncritic_lr_scheduler_type: constant\n"
                    "critic_weight_decay: 1e-2\ncritic_warmup_ratio: 0.0\npretrain_critic_steps: 50\n"
                    "clip_range_value: 0.5\nper_device_value_batch_size: 2\n")


def test_paddlenlp_critic_keys_load_with_their_values():
    # PaddleNLP's VAPO file's critic keys (5e-7 written without a dot is a string to YAML: a float here too).
    cfg = load_config(None, [f"--{k}={v}" for k, v in yaml.safe_load(CRITIC_KEYS_TEXT).items()], device="cpu")
    assert (cfg.rl_algorithm, cfg.needs_critic, cfg.critic_model_name_or_path) == \
        ("vapo", True, "Qwen/Qwen2.5-1.5B-Instruct")
    assert (cfg.critic_learning_rate, cfg.critic_min_learning_rate, cfg.critic_weight_decay) == (1e-5, 1e-5, 1e-2)
    assert (cfg.pretrain_critic_steps, cfg.clip_range_value, cfg.per_device_value_batch_size) == (50, 0.5, 2)
    # The new keys' defaults: PaddleNLP's hard-coded gamma 1, lambda 0.95; VAPO's lam_critic 1, alpha 0.05.
    assert (cfg.gamma, cfg.lam, cfg.lam_critic, cfg.vapo_alpha, cfg.positive_example_lm_coeff) == \
        (1.0, 0.95, 1.0, 0.05, None)


@pytest.mark.parametrize("values, needs_critic, coeff", [
    ({}, False, 0.0),                                                    # grpo: no positive-example loss
    ({"positive_example_lm_coeff": 0.3}, False, 0.3),                    # any estimator, when set
    ({"rl_algorithm": "ppo"}, True, 0.0),
    ({"rl_algorithm": "vapo"}, True, 0.1),                               # VAPO's recipe: the estimator's default
    ({"rl_algorithm": "vapo", "positive_example_lm_coeff": 0.0}, True, 0.0),  # an explicit 0 wins
    ({"rl_algorithm": "vapo", "positive_example_lm_coeff": 0.5}, True, 0.5),
    ({"rl_algorithm": "reinforce_plus_plus"}, False, 0.0),
])
def test_needs_critic_and_the_resolved_positive_lm_coeff(values, needs_critic, coeff):
    critic = {"critic_model_name_or_path": "m"} if values.get("rl_algorithm") in ("ppo", "vapo") else {}
    cfg = config_from_dict({**values, **critic})
    assert cfg.needs_critic is needs_critic
    assert cfg.positive_lm_coeff == coeff and isinstance(cfg.positive_lm_coeff, float)


def test_min_learning_rate_ratios_and_their_bound():
    cfg = config_from_dict({"learning_rate": 1e-6, "min_learning_rate": 2.5e-7, "lr_scheduler_type": "cosine",
                            "critic_learning_rate": 4e-6, "critic_min_learning_rate": 1e-6})
    # One float64 division of two correctly rounded decimals: within a few ulps of 0.25 (2^-52 ~ 2.2e-16 each).
    assert cfg.min_lr_ratio == pytest.approx(0.25, rel=1e-15)
    assert cfg.critic_min_lr_ratio == pytest.approx(0.25, rel=1e-15)
    assert config_from_dict({"learning_rate": 0.0}).min_lr_ratio == 0.0
    with pytest.raises(ConfigError, match=r"key 'min_learning_rate' = 2e-06: must not exceed learning_rate \(1e-06, <dict>\): "
                                          r"the linear schedule \(lr_scheduler_type\) decays"):
        config_from_dict({"learning_rate": 1e-6, "min_learning_rate": 2e-6, "lr_scheduler_type": "linear"})
    # A constant schedule never reaches the floor: PaddleNLP's files set it above or equal, and they load.
    assert config_from_dict({"learning_rate": 1e-6, "min_learning_rate": 2e-6}).min_learning_rate == 2e-6
    critic = {"rl_algorithm": "ppo", "critic_model_name_or_path": "c"}
    with pytest.raises(ConfigError, match=r"key 'critic_min_learning_rate' = 1.0: must not exceed learning_rate "
                                          r"\(critic_learning_rate is unset and takes it\) \(5e-07\)"):
        config_from_dict({**critic, "critic_min_learning_rate": 1.0, "critic_lr_scheduler_type": "cosine"})
    with pytest.raises(ConfigError, match=r"key 'critic_min_learning_rate' = 1.0: must not exceed "
                                          r"critic_learning_rate \(0.5\): the critic's cosine schedule"):
        config_from_dict({**critic, "critic_min_learning_rate": 1.0, "critic_learning_rate": 0.5,
                          "critic_lr_scheduler_type": "cosine"})
    # The inherited floor: min_learning_rate is named, with the key that would set the critic's own.
    with pytest.raises(ConfigError, match=r"key 'min_learning_rate' = 1e-05: is the critic's floor too .* set "
                                          r"critic_min_learning_rate"):
        config_from_dict({**critic, "min_learning_rate": 1e-5, "learning_rate": 1e-4, "critic_learning_rate": 1e-6,
                          "lr_scheduler_type": "cosine"})


# PaddleNLP's create_critic_trainer copies the actor's arguments and overrides only the critic_* keys that are set.
@pytest.mark.parametrize("values, want", [
    ({}, {"critic_learning_rate": 3e-6, "critic_min_learning_rate": 1e-7, "critic_lr_scheduler_type": "cosine",
          "critic_weight_decay": 0.05}),
    ({"critic_learning_rate": 1e-5, "critic_lr_scheduler_type": "linear", "critic_weight_decay": 0.0,
      "critic_min_learning_rate": 0.0},
     {"critic_learning_rate": 1e-5, "critic_min_learning_rate": 0.0, "critic_lr_scheduler_type": "linear",
      "critic_weight_decay": 0.0}),
])
def test_unset_critic_optimizer_keys_take_the_policys(values, want):
    policy = {"learning_rate": 3e-6, "min_learning_rate": 1e-7, "lr_scheduler_type": "cosine", "weight_decay": 0.05}
    cfg = config_from_dict({"rl_algorithm": "ppo", "critic_model_name_or_path": "c", **policy, **values})
    assert {key: cfg.critic_setting(key) for key in want} == want


@pytest.mark.parametrize("values, total, want", [
    ({}, 100, 0),                                               # no warm-up anywhere
    ({"warmup_steps": 7}, 100, 7),                              # the policy's warmup_steps, as PaddleNLP's critic
    ({"warmup_ratio": 0.1}, 50, 5),                             # the policy's ratio, of the critic's own steps
    ({"warmup_steps": 7, "critic_warmup_ratio": 0.2}, 50, 10),  # the critic's own ratio wins
    ({"warmup_steps": 7, "critic_warmup_ratio": 0.0}, 50, 0),   # an explicit 0 too
])
def test_the_critics_warmup_inherits_the_policys_unless_set(values, total, want):
    cfg = config_from_dict({"rl_algorithm": "ppo", "critic_model_name_or_path": "c", **values})
    assert cfg.critic_warmup_steps(total) == want


@pytest.mark.parametrize("values, pretrain, eps_high", [
    ({"rl_algorithm": "vapo"}, 50, 0.28),                                  # the paper's recipe by default
    ({"rl_algorithm": "vapo", "pretrain_critic_steps": 0, "clip_range_ratio_high": 0.2}, 0, 0.2),  # explicit wins
    ({"rl_algorithm": "vapo", "clip_range_ratio": 0.1}, 50, 0.28),         # the high clip is vapo's own default
    ({"rl_algorithm": "ppo"}, 0, 0.2),
    ({"rl_algorithm": "ppo", "clip_range_ratio": 0.3}, 0, 0.3),
    ({"rl_algorithm": "ppo", "pretrain_critic_steps": 3}, 3, 0.2),
    ({"rl_algorithm": "grpo", "pretrain_critic_steps": 3}, 0, 0.2),          # no critic: nothing to pretrain
])
def test_vapo_defaults_are_the_papers_and_an_explicit_value_wins(values, pretrain, eps_high):
    critic = {"critic_model_name_or_path": "m"} if values["rl_algorithm"] in ("ppo", "vapo") else {}
    cfg = config_from_dict({**values, **critic})
    assert (cfg.critic_pretrain_steps, cfg.eps_high) == (pretrain, eps_high)


def test_the_resolved_config_says_what_each_null_key_resolves_to():
    cfg = config_from_dict({"rl_algorithm": "vapo", "critic_model_name_or_path": "m", "learning_rate": 1e-6,
                            "warmup_steps": 5, "critic_weight_decay": 0.0})
    lines = dict(line.split(": ", 1) for line in cfg.format().splitlines() if not line.startswith("#"))
    assert lines["pretrain_critic_steps"] == "null  # null = rl_algorithm vapo's default 50"
    assert lines["clip_range_ratio_high"] == "null  # null = rl_algorithm vapo's default 0.28"
    assert lines["positive_example_lm_coeff"] == "null  # null = rl_algorithm vapo's default 0.1"
    assert lines["critic_learning_rate"] == "null  # null = learning_rate 1.0e-06"
    assert lines["critic_warmup_ratio"] == "null  # null = the policy's warm-up: warmup_steps 5"
    assert lines["critic_weight_decay"] == "0.0"  # set: no note
    assert lines["positive_example_min_reward"].startswith("null  # null = eval_max_reward, else the maximum")
    ppo = config_from_dict({"rl_algorithm": "ppo", "critic_model_name_or_path": "m"}).format()
    assert "pretrain_critic_steps: null  # null = no pretraining" in ppo
    assert "clip_range_ratio_high: null  # null = clip_range_ratio 0.2" in ppo


@pytest.mark.parametrize("values, declared, want", [
    ({}, 1.0, 1.0 - 1e-6),                                     # the reward functions' maximum, as eval/accuracy
    ({}, None, None),                                          # unknown
    ({"eval_max_reward": 3.0}, 1.0, 3.0 - 1e-6),               # eval/accuracy's key wins over the declared one
    ({"positive_example_min_reward": 0.5, "eval_max_reward": 3.0}, 1.0, 0.5),  # the threshold key, exactly
])
def test_the_positive_examples_reward_threshold(values, declared, want):
    got = config_from_dict(values).positive_min_reward(declared)
    assert got == want  # the same float64 subtraction on both sides


def test_a_critic_run_refuses_pipeline_stages_naming_the_keys(tmp_path):
    text = CRITIC_KEYS_TEXT + "pipeline_parallel_degree: 2\n"
    assert error_of(tmp_path, text) == (
        f"{tmp_path / 'cfg.yaml'}:11: key 'pipeline_parallel_degree' = 2: must be 1: rl_algorithm 'vapo' trains a "
        "critic (value model), and the critic is not built for pipeline stages; use tensor_parallel_degree and "
        "sharding instead (critic_model_name_or_path 'Qwen/Qwen2.5-1.5B-Instruct')")
    # The same layout without a critic loads.
    assert load_config(write(tmp_path, "pipeline_parallel_degree: 2\n"), device="cpu").pipeline_parallel_degree == 2


def test_a_critic_run_without_a_critic_model_is_refused_where_it_was_asked_for(tmp_path):
    assert error_of(tmp_path, "seed: 1\nrl_algorithm: ppo\n") == (
        f"{tmp_path / 'cfg.yaml'}:2: key 'critic_model_name_or_path' is empty: rl_algorithm 'ppo' trains a critic "
        "(value model) (rl_algorithm: ppo); name its directory or hub ID (PaddleNLP's configs use the policy's, e.g. "
        "Qwen/Qwen2.5-1.5B-Instruct)")
    assert error_of(tmp_path, "rl_algorithm: ppo\ncritic_model_name_or_path: ' '\n").startswith(
        f"{tmp_path / 'cfg.yaml'}:2: key 'critic_model_name_or_path' is empty")


def test_an_encoder_decoder_policy_is_refused_only_for_a_critic_run():
    from paddle_grpo.config import encoder_decoder_refusal

    ppo = config_from_dict({"rl_algorithm": "ppo", "critic_model_name_or_path": "c", "actor_model_name_or_path": "t5"})
    assert encoder_decoder_refusal(ppo, False) is None
    assert encoder_decoder_refusal(config_from_dict({}), True) is None
    message = encoder_decoder_refusal(ppo, True)
    assert message.startswith("actor_model_name_or_path: 't5' is an encoder-decoder model, and rl_algorithm 'ppo' "
                              "trains a critic (critic_model_name_or_path)")


NO_CRITIC_NOTE = ("trains no critic (value model): its advantages need no values (rl_algorithm ppo, vapo train "
                  "one)")


# Whether a key has an effect depends on the run: the critic's keys on the estimator's spec (needs_values), the
# estimator options on the spec's config_options, the decay floors on the schedule. One line per key set.
@pytest.mark.parametrize("lines, notes", [
    ("critic_learning_rate: 1e-5\nclip_range_value: 0.5\npretrain_critic_steps: 50",
     {"critic_learning_rate": f"rl_algorithm 'grpo' {NO_CRITIC_NOTE}", "clip_range_value":
      f"rl_algorithm 'grpo' {NO_CRITIC_NOTE}", "pretrain_critic_steps": f"rl_algorithm 'grpo' {NO_CRITIC_NOTE}"}),
    ("rl_algorithm: rloo\nper_device_value_batch_size: 2\ngamma: 0.99",
     {"per_device_value_batch_size": f"rl_algorithm 'rloo' {NO_CRITIC_NOTE}",
      "gamma": "rl_algorithm 'rloo' does not take it (an option of rl_algorithm ppo, vapo)"}),
    ("rl_algorithm: ppo\ncritic_model_name_or_path: m\nlam: 0.9\ngamma: 0.99\nvapo_alpha: 0.1\nclip_range_value: 1",
     {"vapo_alpha": "rl_algorithm 'ppo' does not take it (an option of rl_algorithm vapo)"}),
    ("rl_algorithm: vapo\ncritic_model_name_or_path: m\nlam: 0.9\nlam_critic: 0.9\nvapo_alpha: 0.1",
     {"lam": "rl_algorithm 'vapo' does not take it (an option of rl_algorithm ppo)"}),
    ("rl_algorithm: ppo\ncritic_model_name_or_path: m\nnorm_adv_by_std: false",
     {"norm_adv_by_std": "rl_algorithm 'ppo' does not take it (an option of rl_algorithm grpo)"}),
    ("min_learning_rate: 1e-7", {"min_learning_rate": "lr_scheduler_type 'constant' does not decay (linear and "
                                                      "cosine decay to it)"}),
    ("min_learning_rate: 1e-7\nlr_scheduler_type: cosine\nlearning_rate: 1e-6", {}),
    ("rl_algorithm: vapo\ncritic_model_name_or_path: m\ncritic_min_learning_rate: 1e-7",
     {"critic_min_learning_rate": "the critic's schedule, lr_scheduler_type 'constant' (critic_lr_scheduler_type is "
                                  "unset), does not decay (linear and cosine decay to it)"}),
    ("rl_algorithm: vapo\ncritic_model_name_or_path: m\ncritic_min_learning_rate: 1e-7\n"
     "critic_lr_scheduler_type: constant",
     {"critic_min_learning_rate": "critic_lr_scheduler_type 'constant' does not decay (linear and cosine decay to "
                                  "it)"}),
    ("rl_algorithm: vapo\ncritic_model_name_or_path: m\ncritic_min_learning_rate: 1e-7\n"
     "critic_lr_scheduler_type: linear\ncritic_learning_rate: 1e-6", {}),
    # The positive examples are the batch's correct answers: groups of one have them too (no note).
    ("rollout_n: 1\npositive_example_lm_coeff: 0.1\nrl_algorithm: reinforce_plus_plus", {}),
    ("positive_example_min_reward: 1.0",
     {"positive_example_min_reward": "the positive-example LM loss is off (positive_example_lm_coeff 0; "
                                     "rl_algorithm vapo turns it on)"}),
    ("rl_algorithm: vapo\ncritic_model_name_or_path: m\nrollout_n: 1\npositive_example_min_reward: 1.0", {}),
    ("rl_algorithm: vapo\ncritic_model_name_or_path: m\nper_device_value_batch_size: 2\n"
     "positive_example_lm_coeff: 0.2\ngamma: 0.99", {}),
])
def test_a_key_without_effect_in_this_run_gets_a_one_line_note(tmp_path, caplog, lines, notes):
    text = "use_rm_server: false\nreward_funcs: kk\nkl_coeff: 0\n" + lines + "\n"
    path = write(tmp_path, text)
    for device in ("cpu", "gpu"):  # whatever the device
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="paddle_grpo.config"):
            load_config(path, device=device)
        messages = [r.getMessage() for r in caplog.records if r.name == "paddle_grpo.config"]
        assert len(messages) == len(notes)
        for key, note in notes.items():
            line = text.splitlines().index(next(x for x in text.splitlines() if x.startswith(f"{key}:"))) + 1
            assert f"{path}:{line}: key '{key}' has no effect here: {note}" in messages


def test_use_rule_reward_is_paddlenlps_gsm8k_rule_reward(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="paddle_grpo.config"):
        cfg = load_config(write(tmp_path, "use_rm_server: false\nuse_rule_reward: true\n"), device="cpu")
    assert cfg.reward_funcs == "gsm8k" and not cfg.use_rm_server
    assert any("use_rule_reward: true: completions are scored in-process with PaddleNLP's GSM8K rule reward" in
               r.getMessage() for r in caplog.records)
    assert config_from_dict({"use_rm_server": False, "use_rule_reward": True,
                             "reward_funcs": "gsm8k"}).reward_funcs == "gsm8k"
    # What PaddleNLP would resolve by ignoring a key is refused, naming both.
    for extra, other in (("", "use_rm_server is true"), ("use_rm_server: false\nreward_funcs: kk\n", "reward_funcs is 'kk'"),
                         ("use_rm_server: false\nreward_model_name_or_path: rm\n", "reward_model_name_or_path is 'rm'")):
        message = error_of(tmp_path, "use_rule_reward: true\n" + extra)
        assert message.startswith(f"{tmp_path / 'cfg.yaml'}:1: key 'use_rule_reward' = True: ") and other in message


def test_reward_model_is_accepted_as_the_in_process_scorer():
    cfg = config_from_dict({"use_rm_server": False, "reward_model_name_or_path": "my/rm"})
    assert cfg.reward_model_name_or_path == "my/rm" and cfg.per_device_reward_batch_size == 8


def test_every_key_states_its_effect_on_every_device():
    from paddle_grpo.config import DEVICES, Effect

    for key, f in FIELDS.items():
        effect = f.metadata["effect"]
        assert set(effect) == set(DEVICES), key
        for device in DEVICES:
            assert isinstance(effect[device], Effect), (key, device)
            if not effect[device].active:
                assert len(effect[device].note) > 15, (key, device)  # a reason, not a placeholder


@pytest.mark.parametrize("report_to, writes_visualdl", [("wandb", True), ("tensorboard", True), ("none", False)])
def test_report_to_wandb_or_tensorboard_logs_to_visualdl(tmp_path, report_to, writes_visualdl):
    from paddle_grpo.logging import MetricsLogger

    log = MetricsLogger(str(tmp_path / "out"), str(tmp_path / "vdl"), report_to=report_to, disable_tqdm=True)
    log.log(1, {"train/reward": 1.0})
    log.close()
    assert (tmp_path / "vdl").is_dir() == writes_visualdl
    assert json.loads((tmp_path / "out" / "metrics.jsonl").read_text())["train/reward"] == 1.0


@pytest.mark.parametrize("path, marks", [
    ("/models/Qwen2.5-1.5B-Instruc", "'Qwen', '1.5B'"),     # a mistyped path to a real model
    ("Qwen/Qwen2.5-0.5B", "'Qwen', '0.5B'"),                 # a hub ID: the toy would be built in ./Qwen/...
    ("ckpt/llama-7b", "'llama', '7b'"),
])
def test_build_actor_if_missing_refuses_a_path_named_like_a_real_model(tmp_path, monkeypatch, path, marks):
    # a config copied from quickstart.yaml keeps build_actor_if_missing: quickstart; a real model's path that does
    # not exist must not get the 0.6 M-parameter toy built there and trained
    monkeypatch.chdir(tmp_path)
    cfg_path = write(tmp_path, f"actor_model_name_or_path: {path}\nbuild_actor_if_missing: quickstart\n"
                               "use_rm_server: false\nreward_funcs: kk\n")
    with pytest.raises(ConfigError) as e:
        load_config(cfg_path, device="cpu")
    relative = "" if path.startswith("/") else f" (relative to the working directory {tmp_path})"
    assert str(e.value) == (
        f"{cfg_path}:1: key 'actor_model_name_or_path' = '{path}': does not exist{relative}, and "
        f"build_actor_if_missing: quickstart ({cfg_path}:2) would build the 'quickstart' recipe's tiny toy policy "
        f"(about 0.6 M parameters) there and train it; its name looks like a real model's ({marks}), so it is not "
        "built. Check the path (a directory written by save_pretrained, or a hub ID such as "
        "Qwen/Qwen2.5-1.5B-Instruct) and set build_actor_if_missing: '' for your own model; to build the toy "
        "policy, name a path that does not look like a model's (the quickstart's is build/quickstart_policy)")


@pytest.mark.parametrize("path", ["build/quickstart_policy", "build/quickstart_tools_policy", "build/qs_s42",
                                  "build/qs_ppo_s1", "policy", "built_policy"])
def test_build_actor_if_missing_builds_at_a_toy_name(tmp_path, monkeypatch, path):
    # the names the quickstarts, tools/eval/quickstart_seeds.py and the tests build at; and an existing real-looking
    # directory is simply used (nothing to build)
    monkeypatch.chdir(tmp_path)
    assert config_from_dict({"actor_model_name_or_path": path, "build_actor_if_missing": "quickstart"})
    (tmp_path / "Qwen2.5-0.5B").mkdir()
    assert config_from_dict({"actor_model_name_or_path": "Qwen2.5-0.5B", "build_actor_if_missing": "quickstart"})


def test_the_recipe_refuses_to_build_at_a_real_model_name_even_unvalidated(tmp_path):
    # a Config built directly skips validation: the recipe's build itself refuses the name, before building
    from paddle_grpo.recipes import policy_builder

    build = policy_builder(Config(build_actor_if_missing="quickstart"))
    with pytest.raises(ValueError, match=r"refusing to build the tiny toy policy at '.*Qwen2.5-1.5B-Instruc', whose "
                                         r"name looks like a real model's \('Qwen', '1.5B'\)"):
        build(str(tmp_path / "Qwen2.5-1.5B-Instruc"))
    assert not (tmp_path / "Qwen2.5-1.5B-Instruc").exists()
