"""`run_rl.py CONFIG --dry_run` (paddle_grpo/dry_run.py): every check reports its problem by file, line, key or URL,
the exit status says whether the launch could start, and the launch command fits the layout. Real files, a real
tiny model directory, a real reward server on 127.0.0.1."""
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import yaml

from dry_run_helpers import REPO, base_args, closed_port, run_rl_main, thread_prefix
from paddle_grpo.config import FIELDS, Config, ConfigError, config_from_dict, parse_args, yaml_value
from paddle_grpo.dry_run import keys_without_effect, launch_command, required_processes, split_dry_run
from reward_server import create_app


@pytest.fixture
def base(tmp_path, tiny_policy_dir):
    """Arguments of a valid in-process-reward run on the tiny model (no config file)."""
    return base_args(tmp_path, tiny_policy_dir)


@pytest.mark.parametrize("argv, expected", [
    (["c.yaml", "--dry_run"], (True, ["c.yaml"])),
    (["--dry_run", "c.yaml"], (True, ["c.yaml"])),  # a bare flag leaves the next argument alone
    (["c.yaml", "--dry_run", "true", "--seed", "1"], (True, ["c.yaml", "--seed", "1"])),
    (["c.yaml", "--dry_run", "false"], (False, ["c.yaml"])),
    (["c.yaml", "--dry_run=1"], (True, ["c.yaml"])),
    (["c.yaml", "--seed", "1"], (False, ["c.yaml", "--seed", "1"])),
])
def test_split_dry_run(argv, expected):
    assert split_dry_run(argv) == expected


def test_dry_run_value_must_be_a_boolean():
    with pytest.raises(ConfigError, match="command line: --dry_run expects true or false, got 'maybe'"):
        split_dry_run(["--dry_run=maybe"])


def test_launch_command_fits_the_layout():
    argv = ["cfg.yaml", "--train_datasets", "my data.jsonl"]
    plain = {}  # no thread variables (test_dry_run_launch.py checks the lines with them)
    assert launch_command(config_from_dict({}), argv, "cpu", environ=plain) == \
        "python run_rl.py cfg.yaml --train_datasets 'my data.jsonl'"
    tp2 = config_from_dict({"tensor_parallel_degree": 2})
    assert launch_command(tp2, argv, "cpu", environ=plain) == (
        'python -m paddle.distributed.launch --devices "" --nproc_per_node 2 '
        "run_rl.py cfg.yaml --train_datasets 'my data.jsonl'")
    assert launch_command(tp2, argv, "gpu", environ=plain).startswith(
        'python -m paddle.distributed.launch --devices "0,1" run_rl.py')
    sharded = config_from_dict({"tensor_parallel_degree": 2, "sharding": "stage1", "sharding_parallel_degree": 2})
    assert required_processes(sharded) == 4
    assert required_processes(config_from_dict({"pipeline_parallel_degree": 2, "tensor_parallel_degree": 1})) == 2


def test_a_batch_that_no_process_count_splits_is_an_error():
    cfg = config_from_dict({"tensor_parallel_degree": 2, "sharding": "stage1", "sharding_parallel_degree": 2,
                            "global_batch_size": 1, "rollout_n": 8})
    with pytest.raises(ConfigError, match=r"no number of processes fits this layout: with 4: global_batch_size \(1\) "
                                          "must be divisible by the data-parallel degree 2"):
        required_processes(cfg)


def test_keys_without_effect_depend_on_the_device():
    cfg = config_from_dict({"bf16": True, "offload_level": "freeze_model"})
    cpu = {key: (value, reason) for key, value, _, reason in keys_without_effect(cfg, "cpu")}
    gpu = {key for key, _, _, _ in keys_without_effect(cfg, "gpu")}
    assert cpu["bf16"][0] == "true" and cpu["bf16"][1].startswith("paddle has no bfloat16 matmul kernel on CPU")
    assert "bf16" not in gpu and "offload_level" in gpu and "offload_level" in cpu


def test_keys_without_effect_are_only_the_keys_set(tmp_path):
    # Newcomer finding 4: the table listed 32 keys the file never set (their defaults ask for nothing).
    from paddle_grpo.config import parse_args

    (tmp_path / "c.yaml").write_text("use_flash_attention: true\nlearning_rate: 1e-6\n", encoding="utf-8")
    cfg = parse_args([str(tmp_path / "c.yaml"), "--bf16", "true"])
    rows = keys_without_effect(cfg, "cpu")
    assert [(key, value, where) for key, value, where, _ in rows] == [
        ("use_flash_attention", "true", f"{tmp_path / 'c.yaml'}:1"), ("bf16", "true", "command line")]
    assert keys_without_effect(parse_args([]), "cpu") == []


def test_keys_without_effect_on_any_device_say_so(tmp_path):
    # sequence_parallel (PaddleNLP's files, the shipped ppo.yaml) does nothing on a GPU either: the table says so,
    # unlike bf16, which a GPU would use
    (tmp_path / "c.yaml").write_text("sequence_parallel: true\nbf16: true\n")
    cfg = parse_args([str(tmp_path / "c.yaml")])
    reasons = {key: reason for key, _, _, reason in keys_without_effect(cfg, "cpu")}
    assert reasons["sequence_parallel"].startswith("on every device: PaddleNLP's sequence-parallel models")
    assert not reasons["bf16"].startswith("on every device")
    assert [key for key, _, _, _ in keys_without_effect(cfg, "gpu")] == ["sequence_parallel"]


def test_a_valid_single_process_run_passes(base, tmp_path, capsys):
    status, out, err = run_rl_main([*base, "--dry_run"], capsys)
    assert status == 0, out + err
    # only the keys that differ from the defaults are printed; all of them are in the file it names
    head = out.split("\nchecks:\n")[0].splitlines()
    assert head[0].startswith("configuration: the keys that differ from the defaults (all keys, resolved: ")
    full = re.search(r"resolved: (\S+\.yaml);", head[0]).group(1)
    resolved = yaml.safe_load(pathlib.Path(full).read_text(encoding="utf-8"))
    assert set(resolved) == set(FIELDS) and resolved["max_dec_len"] == 16 and resolved["top_p"] == 1.0
    shown = dict(line.split(": ", 1) for line in head[1:] if not line.startswith("#"))
    assert shown == {k: yaml_value(v) for k, v in resolved.items() if v != getattr(Config(), k)}
    assert "max_dec_len" in shown and "top_p" not in shown  # top_p is left at its default
    assert "\nkeys set here that have no effect on this device (cpu): 1\n  max_length " in out
    assert "  train_datasets: 16 records" in out and "(Qwen2Config, Qwen2Tokenizer, vocabulary 320)" in out
    assert f"\nlaunch: {thread_prefix()}python run_rl.py --actor_model_name_or_path " in out
    assert out.rstrip().endswith("dry run: ok")
    assert not (tmp_path / "out").exists()  # nothing was trained or written


def test_dry_runs_of_one_run_overwrite_one_resolved_config_file(base, tmp_path, capsys):
    # each dry run used to leave a new paddle_grpo_dry_run_<content hash>.yaml in the temporary directory; the
    # dry runs of one output_dir now share one file, holding the latest configuration
    files = []
    for seed in (1, 2):
        status, out, err = run_rl_main([*base, "--seed", seed, "--dry_run"], capsys)
        assert status == 0, out + err
        files.append(pathlib.Path(re.search(r"resolved: (\S+\.yaml);", out).group(1)))
    assert files[0] == files[1]
    assert yaml.safe_load(files[1].read_text(encoding="utf-8"))["seed"] == 2
    status, out, _ = run_rl_main([*base, "--output_dir", tmp_path / "other", "--dry_run"], capsys)
    other = pathlib.Path(re.search(r"resolved: (\S+\.yaml);", out).group(1))
    assert other != files[0]  # another run's dry run does not overwrite this one's
    for path in {files[0], other}:
        path.unlink()


def test_data_error_names_file_and_line(base, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"src": "q", "tgt": "a"}\n{"src": "q2", "tgt": \n', encoding="utf-8")
    status, out, _ = run_rl_main([*base, "--train_datasets", bad, "--dry_run"], capsys)
    assert status == 2
    assert f"  - train_datasets: {bad}:2: " in out


def test_model_directory_without_config_json(base, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    status, out, _ = run_rl_main([*base, "--actor_model_name_or_path", tmp_path / "empty", "--dry_run"], capsys)
    assert status == 2
    assert f"  - actor_model_name_or_path: '{tmp_path / 'empty'}' is not a whole model directory (as save_pretrained " \
           "writes it): it lacks config.json, tokenizer_config.json, model.safetensors.index.json or " in out


def test_unknown_reward_function(base, capsys):
    status, out, _ = run_rl_main([*base, "--reward_funcs", "kk,no_such_reward", "--dry_run"], capsys)
    assert status == 2
    assert "  - reward_funcs: 'no_such_reward': " in out


def test_reward_server_health_is_asked(base, serve, capsys):
    url = serve(create_app("kk")).url
    status, out, err = run_rl_main([*base, "--use_rm_server", "true", "--reward_server", url, "--dry_run"], capsys)
    assert status == 0, out + err
    assert f"  reward_server: {url}/health: ok" in out
    down = f"http://127.0.0.1:{closed_port()}"
    status, out, _ = run_rl_main([*base, "--use_rm_server", "true", "--reward_server", f"{url},{down}",
                                  "--dry_run"], capsys)
    assert status == 2
    assert f"  - reward_server: {down}/health cannot be reached: ConnectionError" in out


def test_layout_that_cannot_start_exits_2_with_the_reason(base, capsys):
    status, out, _ = run_rl_main([*base, "--tensor_parallel_degree", "2", "--pipeline_parallel_degree", "2",
                                  "--dry_run"], capsys)
    assert status == 2
    assert "  - tensor_parallel_degree (2) together with pipeline_parallel_degree (2) is not supported" in out
    status, out, _ = run_rl_main([*base, "--tensor_parallel_degree", "2", "--dry_run"], capsys)
    assert status == 0, out
    launch = f'{thread_prefix()}python -m paddle.distributed.launch --devices "" --nproc_per_node 2 '
    assert f"\nlaunch: {launch}" in out


def test_plain_run_on_the_wrong_number_of_processes_prints_the_launch_command(base, tmp_path):
    # A real process, as a user starts it: tensor_parallel_degree 2 on one process.
    (tmp_path / "c.yaml").write_text(json.dumps({"tensor_parallel_degree": 2}), encoding="utf-8")
    argv = [str(tmp_path / "c.yaml"), *map(str, base)]
    out = subprocess.run([sys.executable, "run_rl.py", *argv], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "run_rl.py: error: tensor_parallel_degree (2) x pipeline_parallel_degree (1) = 2 does not divide the " \
           "number of processes (1)" in out.stderr
    # (the child started with this process's os.environ, where paddle's import set OMP_NUM_THREADS)
    expected = launch_command(config_from_dict({"tensor_parallel_degree": 2}), argv, "cpu", environ=os.environ)
    assert out.stderr.rstrip().endswith(f"run_rl.py: start it with: {expected}")


def test_a_model_id_that_is_not_a_local_directory(base, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PPNLP_HOME", str(tmp_path / "empty_cache"))  # never a real cache, never a download
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    status, out, _ = run_rl_main([*base, "--actor_model_name_or_path", "Qwen/No-Such-Model-0B", "--dry_run"],
                                 capsys)
    # offline here (PaddleNLP's server does not answer) and not cached: the launch could not start
    assert status == 2 and "  - actor_model_name_or_path: " in out and "Qwen/No-Such-Model-0B" in out, out
    assert "nor in PaddleNLP's cache (" in out and "under PPNLP_HOME" in out  # names the cache searched


def test_on_gpu_the_launch_names_the_devices_and_needs_them(base, capsys):
    from paddle_grpo.config import parse_args
    from paddle_grpo.dry_run import dry_run, visible_gpus

    argv = [str(a) for a in base] + ["--tensor_parallel_degree", "2", "--bf16", "true"]
    status = dry_run(parse_args(argv), argv, "gpu")
    out = capsys.readouterr().out
    assert f'\nlaunch: {thread_prefix()}python -m paddle.distributed.launch --devices "0,1" run_rl.py ' in out
    assert not any(line.startswith("  bf16 ") for line in out.splitlines())  # bf16 has its effect on a GPU
    if visible_gpus() < 2:
        assert status == 2 and f"  - the layout needs 2 GPUs; {visible_gpus()} are visible" in out
    else:
        assert status == 0, out


def test_the_printed_launch_command_starts_and_trains(base, tmp_path, capsys, monkeypatch):
    # The dry run's launch line for tensor_parallel_degree 2, run as printed (2 CPU processes, one step).
    import os

    monkeypatch.chdir(tmp_path)  # paddle.distributed.launch writes log/ here; run_rl.py is then named by full path
    argv = [*base, "--tensor_parallel_degree", "2", "--max_steps", "1", "--save_strategy", "no", "--report_to",
            "none", "--disable_tqdm", "true"]
    status, out, err = run_rl_main([*argv, "--dry_run"], capsys)
    assert status == 0, out + err
    launch = next(line for line in out.splitlines() if line.startswith("launch: "))[len("launch: "):]
    assert launch.startswith(f'{thread_prefix()}python -m paddle.distributed.launch --devices "" --nproc_per_node 2 '
                             f'{REPO}/run_rl.py ')
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(launch.replace("python ", sys.executable + " ", 1), shell=True, cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (row,) = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1


def test_a_reward_model_in_reward_funcs_is_checked_without_reading_its_weights(base, tmp_path, tiny_reward_model_dir,
                                                                                capsys):
    # Review defect 6: `reward_funcs: reward_model:<dir>` must be checked like reward_model_name_or_path (config and
    # tokenizer, no weights). The weights here are garbage: loading them would fail, so a pass proves they were not
    # read, and the check still reads the config (its class is printed).
    import shutil

    rm = tmp_path / "rm"
    shutil.copytree(tiny_reward_model_dir, rm)
    (weights,) = [p for p in rm.iterdir() if p.name.startswith(("model_state", "model.safetensors"))]
    weights.write_bytes(b"not weights")
    status, out, err = run_rl_main([*base, "--reward_funcs", f"kk,reward_model:{rm}", "--dry_run"], capsys)
    assert status == 0, out + err
    assert f"  reward_funcs: reward_model:{rm}: {rm} (Qwen2Config, " in out


def test_a_reward_model_hub_id_in_reward_funcs_is_never_downloaded(base, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PPNLP_HOME", str(tmp_path / "empty_cache"))  # never a real cache, never a download
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    status, out, _ = run_rl_main([*base, "--reward_funcs", "kk,reward_model:Org/No-Such-RM", "--dry_run"], capsys)
    assert status == 2
    # one problem line, the key named once, the cache searched named (resolve_model's message, not a load's)
    (line,) = [x for x in out.splitlines() if x.startswith("  - reward_funcs")]
    assert line.startswith("  - reward_funcs: reward_model:Org/No-Such-RM: 'Org/No-Such-RM' is neither a local "
                           "directory nor in PaddleNLP's cache ("), line
    assert line.count("reward_funcs") == 1


def test_a_problem_line_names_its_key_once(base, capsys, tmp_path):
    status, out, _ = run_rl_main([*base, "--actor_model_name_or_path", tmp_path / "no" / "such" / "dir", "--dry_run"],
                                 capsys)
    assert status == 2
    (line,) = [x for x in out.splitlines() if x.startswith("  - actor_model_name_or_path")]
    assert line.count("actor_model_name_or_path") == 1, line


def test_prompts_longer_than_max_prompt_len_are_a_warning_with_the_numbers(base, tmp_path, tiny_policy_dir, capsys,
                                                                            monkeypatch):
    # Newcomer finding 4: a config whose launch left-truncated 8 of 8 prompts passed silently. Reference: the token
    # counts from PaddleNLP's tokenizer called directly (chat_template none: the prompt text as is).
    from paddlenlp.transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_policy_dir)
    prompts = ["Who is a knight?", "Zoey says Ethan is a knave. " * 8, "Who?", "Ethan says Zoey is a knight. " * 12]
    counts = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    limit = 30
    assert counts[0] < limit < counts[1] < counts[3]  # two prompts over the limit, the last the longest
    data = tmp_path / "long.jsonl"
    lines = [json.dumps({"src": p, "tgt": "x"}) for p in prompts]
    data.write_text(lines[0] + "\n\n" + "\n".join(lines[1:]) + "\n", encoding="utf-8")  # a blank line 2
    status, out, err = run_rl_main([*base, "--train_datasets", data, "--chat_template", "none", "--max_prompt_len",
                                    limit, "--dry_run"], capsys)
    assert status == 0, out + err  # the launch can start: a warning, not a problem
    assert (f"  ! train_datasets: 2 of 4 prompts are longer than max_prompt_len ({limit}) and would be left-truncated "
            f"(their first tokens dropped); the longest has {counts[3]} tokens ({data}:5). To keep them whole: "
            f"max_prompt_len {counts[3]} (and max_length at least {counts[3]} + max_dec_len = {counts[3] + 16})") in out
    assert out.rstrip().endswith("dry run: ok, with 1 warning(s) above")
    status, out, _ = run_rl_main([*base, "--train_datasets", data, "--chat_template", "none", "--max_prompt_len",
                                  counts[3], "--max_length", counts[3] + 16, "--dry_run"], capsys)
    assert status == 0 and f"  train_datasets: prompts of {min(counts)}-{counts[3]} tokens, none longer" in out
    assert out.rstrip().endswith("dry run: ok")
    # a file larger than MAX_LENGTH_CHECKS: an even sample (here prompts 0 and 2 of 4), and the line says so
    monkeypatch.setattr("paddle_grpo.dry_run.prompts.MAX_LENGTH_CHECKS", 2)
    status, out, _ = run_rl_main([*base, "--train_datasets", data, "--chat_template", "none", "--max_prompt_len",
                                  limit, "--dry_run"], capsys)
    assert status == 0 and (f"  train_datasets: prompts of {counts[2]}-{counts[0]} tokens, none longer than "
                            f"max_prompt_len ({limit}) (a sample: 1 in 2 of 4)") in out


def test_the_dry_run_says_which_lm_head_the_run_will_use(base, capsys):
    """The same decision and line as the run's start-up (config.lm_head_decision at the model's vocabulary)."""
    vocab = json.loads((pathlib.Path(base[1]) / "config.json").read_text())["vocab_size"]
    status, out, _ = run_rl_main([*base, "--dry_run"], capsys)
    assert status == 0
    assert (f"  LM head: full [rows, T, {vocab}] logits (use_fused_head_and_loss_fn unset, vocabulary {vocab:,} "
            "< 8,192 (set it to choose))\n") in out
    status, out, _ = run_rl_main([*base, "--use_fused_head_and_loss_fn", "true", "--dry_run"], capsys)
    assert status == 0
    assert "  LM head: chunked, 512 positions at a time (use_fused_head_and_loss_fn: true in the config)\n" in out


# ------------------------------------------------------------------------------------------- critic runs (ppo, vapo)

def critic_args(base, critic, algorithm="ppo"):
    return [*base, "--rl_algorithm", algorithm, "--critic_model_name_or_path", critic]


def copy_model(src, dst, drop=(), config=None):
    """A copy of model directory `src` at `dst` without the files named in `drop`, its config.json updated with
    `config`; returns dst."""
    import shutil

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*drop))
    if config:
        path = pathlib.Path(dst) / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}), encoding="utf-8")
    return dst


@pytest.mark.parametrize("algorithm", ["ppo", "vapo"])
def test_a_critic_run_checks_the_critic_and_says_what_it_loads(base, tiny_policy_dir, algorithm, capsys):
    status, out, err = run_rl_main([*critic_args(base, tiny_policy_dir, algorithm), "--per_device_value_batch_size",
                                    "3", "--clip_range_value", "0.5", "--dry_run"], capsys)
    assert status == 0, out + err
    (line,) = [x for x in out.splitlines() if x.startswith("  critic_model_name_or_path:")]
    assert line == (f"  critic_model_name_or_path: {tiny_policy_dir} (Qwen2Config, vocabulary 320): a causal LM "
                    "(Qwen2ForCausalLM): its backbone with a new value head initialised to zeros (every value starts "
                    "at 0; the LM head's weights are dropped)")
    # The critic's keys have their effect here: only max_length is in the table of keys without effect.
    assert "\nkeys set here that have no effect on this device (cpu): 1\n  max_length " in out


def test_a_reward_model_as_critic_keeps_its_score_head(base, tiny_reward_model_dir, capsys):
    status, out, err = run_rl_main([*critic_args(base, tiny_reward_model_dir), "--dry_run"], capsys)
    assert status == 0, out + err
    assert (f"  critic_model_name_or_path: {tiny_reward_model_dir} (Qwen2Config, vocabulary 320): a reward model "
            "(Qwen2ForSequenceClassification): its one-label score head is the value head\n") in out


def test_a_critic_directory_needs_no_tokenizer_but_its_weights(base, tiny_policy_dir, tmp_path, capsys):
    # A critic reads the policy's token ids: a checkpoint without tokenizer files passes; one without weights not.
    no_tokenizer = copy_model(tiny_policy_dir, tmp_path / "critic", drop=("tokenizer*", "vocab.json", "merges.txt",
                                                                          "special_tokens_map.json", "added_tokens.json"))
    status, out, err = run_rl_main([*critic_args(base, no_tokenizer), "--dry_run"], capsys)
    assert status == 0, out + err
    no_weights = copy_model(tiny_policy_dir, tmp_path / "critic2", drop=("model_state*", "model*.safetensors*"))
    status, out, _ = run_rl_main([*critic_args(base, no_weights), "--dry_run"], capsys)
    assert status == 2
    (line,) = [x for x in out.splitlines() if x.startswith("  - critic_model_name_or_path")]
    assert line.startswith(f"  - critic_model_name_or_path: '{no_weights}' is not a whole model directory: it "
                           "lacks model.safetensors.index.json or ")
    # A real run stops at its start with the same key named (run_rl.py's preflight), before loading anything.
    status, _, err = run_rl_main(critic_args(base, no_weights), capsys)
    assert status == 2 and f"run_rl.py: error: critic_model_name_or_path: '{no_weights}' is not a whole" in err


def test_a_critic_with_a_smaller_vocabulary_than_the_policy_is_a_problem(base, tiny_policy_dir, tmp_path, capsys):
    # Only config.json is read (the weights, now the wrong shape, are not).
    small = copy_model(tiny_policy_dir, tmp_path / "critic", config={"vocab_size": 100})
    status, out, _ = run_rl_main([*critic_args(base, small), "--dry_run"], capsys)
    assert status == 2
    assert (f"  - critic_model_name_or_path: '{small}' has a vocabulary of 100 tokens, the policy's tokenizer 320: "
            "the critic reads the policy's token ids, so it needs the policy's vocabulary") in out


def test_a_critic_hub_id_is_never_downloaded(base, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PPNLP_HOME", str(tmp_path / "empty_cache"))  # never a real cache, never a download
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    status, out, _ = run_rl_main([*critic_args(base, "Qwen/No-Such-Critic-0B"), "--dry_run"], capsys)
    assert status == 2
    (line,) = [x for x in out.splitlines() if x.startswith("  - critic_model_name_or_path")]
    assert line.startswith("  - critic_model_name_or_path: 'Qwen/No-Such-Critic-0B' is neither a local directory nor "
                           "in PaddleNLP's cache ("), line


def test_a_critic_run_with_an_encoder_decoder_policy_is_refused(base, tmp_path, tiny_policy_dir, capsys):
    from conftest import TINY_CORPUS
    from paddle_grpo.recipes.seq2seq import build_tiny_seq2seq

    t5 = tmp_path / "t5"
    build_tiny_seq2seq(str(t5), TINY_CORPUS, vocab_size=300, d_model=16, ffn_dim=32, num_layers=1, num_heads=2)
    args = [*critic_args(base, tiny_policy_dir), "--actor_model_name_or_path", t5]
    expected = (f"actor_model_name_or_path: '{t5}' is an encoder-decoder model, and rl_algorithm 'ppo' trains a "
                "critic (critic_model_name_or_path), which is a decoder backbone")
    status, out, _ = run_rl_main([*args, "--dry_run"], capsys)
    assert status == 2 and f"  - {expected}" in out
    status, _, err = run_rl_main(args, capsys)  # the run's start: refused before anything is loaded
    assert status == 2 and f"run_rl.py: error: {expected}" in err
    # Without a critic the same policy passes the dry run.
    status, out, err = run_rl_main([*base, "--actor_model_name_or_path", t5, "--dry_run"], capsys)
    assert status == 0, out + err


def test_a_critic_started_from_the_policy_the_recipe_builds(base, tmp_path, capsys):
    policy = tmp_path / "built_policy"  # does not exist yet: build_actor_if_missing builds it at start-up
    args = [*critic_args(base, policy), "--actor_model_name_or_path", policy, "--build_actor_if_missing", "quickstart"]
    status, out, err = run_rl_main([*args, "--dry_run"], capsys)
    assert status == 0, out + err
    assert (f"  critic_model_name_or_path: the policy '{policy}', built first by the 'quickstart' recipe: a causal "
            "LM: its backbone with a new value head initialised to zeros\n") in out
    assert not policy.exists()


def test_critic_keys_of_a_run_without_a_critic_are_in_the_table_with_the_reason(base, tmp_path, capsys):
    status, out, _ = run_rl_main([*base, "--per_device_value_batch_size", "2", "--critic_learning_rate", "1e-5",
                                  "--dry_run"], capsys)
    assert status == 0
    rows = {x.split()[0]: x for x in out.split("no effect on this device (cpu): ")[1].split("\n\n")[0].splitlines()[1:]}
    for key in ("per_device_value_batch_size", "critic_learning_rate"):
        assert re.match(rf"  {key} +\S+ +command line +rl_algorithm 'grpo' trains no critic \(value model\): its "
                        r"advantages need no values \(rl_algorithm ppo, vapo train one\)$", rows[key]), rows[key]


def test_a_critic_checkpoint_and_a_two_label_classifier(base, tiny_policy_dir, tmp_path, capsys):
    from paddle_grpo.policy import load_critic

    saved = load_critic(tiny_policy_dir).save(str(tmp_path / "critic"))  # what a run's checkpoint holds
    status, out, err = run_rl_main([*critic_args(base, saved), "--dry_run"], capsys)
    assert status == 0, out + err
    assert (f"  critic_model_name_or_path: {saved} (Qwen2Config, vocabulary 320): a critic checkpoint "
            "(Qwen2ForSequenceClassification): backbone and value head as saved\n") in out
    two = copy_model(saved, tmp_path / "two_labels", config={"id2label": {"0": "LABEL_0", "1": "LABEL_1"},
                                                             "label2id": {"LABEL_0": 0, "LABEL_1": 1}})
    status, out, _ = run_rl_main([*critic_args(base, two), "--dry_run"], capsys)
    assert status == 2
    assert (f"  - critic_model_name_or_path: {two}/config.json describes a sequence classifier with 2 labels; a "
            "critic or reward model has one output (num_labels 1)") in out
