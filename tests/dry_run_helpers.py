"""Shared by tests/test_dry_run.py, tests/test_dry_run_tools.py and tests/config/test_paddlenlp_configs.py: run_rl.py's main
in this process (paddle is imported once, so each dry run costs a fraction of a second), small local data files, the
arguments of a valid tiny run, a port nothing listens on, and the launch line's thread prefix in this process."""
import importlib.util
import json
import pathlib
import socket

REPO = pathlib.Path(__file__).resolve().parent.parent


def thread_prefix():
    """What a dry run's launch line starts with in this test process: the thread variables (OMP_NUM_THREADS,
    MKL_NUM_THREADS) it was started with, as `launch_command` repeats them ('' when none was set)."""
    from paddle_grpo.dry_run import launch_command
    from paddle_grpo.config import config_from_dict

    return launch_command(config_from_dict({}), [], "cpu").split("python ", 1)[0]


def run_rl_main(argv, capsys):
    """(exit status, stdout, stderr) of `python run_rl.py *argv`, run in-process."""
    spec = importlib.util.spec_from_file_location("run_rl_under_test", REPO / "run_rl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    capsys.readouterr()
    status = module.main([str(a) for a in argv])
    out = capsys.readouterr()
    return status, out.out, out.err


def write_train_eval(directory, make_row, n=16, prefix=""):
    """`<prefix>train.jsonl` and `<prefix>eval.jsonl` of `n` records `make_row(i)` each in `directory`; their paths."""
    paths = []
    for name in ("train", "eval"):
        path = pathlib.Path(directory) / f"{prefix}{name}.jsonl"
        path.write_text("".join(json.dumps(make_row(i)) + "\n" for i in range(n)), encoding="utf-8")
        paths.append(path)
    return paths


def write_kk_data(directory, n=16):
    """train.jsonl and eval.jsonl with `n` src/tgt records each in `directory`; returns their paths."""
    return write_train_eval(directory, lambda i: {
        "src": f"<|im_start|>user\nWho is person {i}?<|im_end|>\n<|im_start|>assistant\n<think>",
        "tgt": f"(1) Person {i} is a knight"}, n)


def base_args(tmp_path, policy_dir):
    """Arguments of a valid in-process-reward run on the tiny model `policy_dir` (no config file)."""
    train, _ = write_kk_data(tmp_path)
    return ["--actor_model_name_or_path", policy_dir, "--train_datasets", train, "--use_rm_server", "false",
            "--reward_funcs", "kk", "--global_batch_size", "2", "--rollout_n", "2", "--per_device_train_batch_size",
            "2", "--max_dec_len", "16", "--min_dec_len", "1", "--max_prompt_len", "64", "--max_length", "80",
            "--kl_coeff", "0", "--output_dir", tmp_path / "out"]


LENGTH_REWARD = """
def length_reward(prompts, completions, **kwargs):
    return [0.1 * len(c) for c in completions]
"""


def one_step_run_argv(tmp_path, model):
    """(argv of `python run_rl.py ...` training one GRPO step of 4 prompts x 4 samples on `model` (a directory or
    a hub ID) with a length reward from a file, its output_dir). Writes the data and the reward file."""
    rows = [{"src": f"<|im_start|>user\nWho is {n}?<|im_end|>\n<|im_start|>assistant\n", "tgt": n}
            for n in ("Ann", "Bob", "Cid", "Dan")]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "rewards.py").write_text(LENGTH_REWARD)
    out_dir = tmp_path / "out"
    args = dict(actor_model_name_or_path=model, use_rm_server="false",
                reward_funcs=f"{tmp_path / 'rewards.py'}:length_reward", train_datasets=tmp_path / "train.jsonl",
                output_dir=out_dir, logging_dir=out_dir / "vdl", max_prompt_len=32, max_dec_len=8, min_dec_len=1,
                max_length=40, global_batch_size=4, rollout_n=4, per_device_train_batch_size=8,
                per_device_logprob_batch_size=16, learning_rate=2e-3, max_steps=1, kl_coeff=0.0,
                save_strategy="no", disable_tqdm="true", seed=7)
    argv = [str(REPO / "run_rl.py")] + [str(x) for k, v in args.items() for x in (f"--{k}", v)]
    return argv, out_dir


def closed_port():
    """A port on 127.0.0.1 that was free a moment ago (nothing listens on it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
