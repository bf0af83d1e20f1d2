"""Benchmark of full RL steps with a random Qwen2 of any size (its interface and results: docs/PERFORMANCE.md).

    python tools/bench/bench.py --shape tools/bench/shapes/default.json [--threads 2] [--repeat 3] \
        [--set completion_len=128]
    python tools/bench/bench.py --shape tools/bench/shapes/qwen2.5-0.5b-2layers.json --lengths uniform:32  # real size
    python tools/bench/bench.py --config use_fused_head_and_loss_fn=false     # a trainer config key overridden
    python tools/bench/bench.py --threads 1 --config async_rollout=true  # rollouts in the worker process, overlapping
    python tools/bench/bench.py --algorithm ppo     # a PPO step: the same, plus a critic (values, critic update)
    python tools/bench/bench.py --turns 2 --set completion_len=160   # multi-turn: a calculator call, then the answer
    python tools/bench/bench.py --gemm --threads 2  # paddle's peak fp32 GEMM rate on this machine
    python tools/bench/bench.py --ops [ARGS]        # per-op timings at the real vocabulary (tools/bench/bench_ops.py)
    python tools/bench/bench.py --model build/models/smollm2-135m-instruct \
        --shape tools/bench/shapes/smollm2.json     # a real model

Builds, in a temporary directory and without any download, a character-level tokenizer with exactly `vocab_size`
tokens (`recipes.tiny.build_char_tokenizer`: characters, then synthetic lowercase words, so that every id decodes to
text; prompts encode one character per token) and a random `Qwen2ForCausalLM` of the SHAPE.json sizes, writes
`prompts_per_step * (warmup + timed)` distinct prompts of exactly `prompt_len` tokens, and runs `warmup_steps +
timed_steps` steps of the real `Trainer` (GRPO, on-policy, one optimizer step per rollout, all sequences of a step in
one micro-batch unless SHAPE.json has `micro_batch_size`): rollout, an in-process reward, the reference log-probs
when `beta > 0` (as `kl_loss_coeff = beta`), advantages and the update. SHAPE.json may also hold `config` (a dict of
trainer config keys overriding the bench's, e.g. {"use_fused_head_and_loss_fn": true}; `--config KEY=VALUE` adds
to it, VALUE parsed as JSON, else taken as a string) and `lengths` (as `--lengths`).

`--model DIR`: a real model directory (PaddleNLP-loadable, e.g. tools/models/import_gguf.py's output) instead of the
random one: its weights, its tokenizer and its Jinja chat template. The prompts are the user questions of MODEL_PROMPTS
(data/smollm2_add/train.jsonl: the last user turn of each templated `src`, in file order), the first
`prompts_per_step * (warmup + timed)` of them, rendered by the trainer with the model's chat template
(`chat_template: auto`): 45-47 tokens for SmolLM2 (its default system turn included; digits are single tokens),
left-padded to the longest of a step. SHAPE.json still gives the batch, `completion_len`, `beta` and the steps; its
model-size keys and `prompt_len` are ignored (`ignored_shape_keys` in the JSON line lists them with their SHAPE.json
values; `shape` holds the model's sizes and the longest prompt instead). The JSON line adds `model` and
`prompt_tokens` (each prompt's token count, as the trainer tokenizes it: tools/bench/trl_bench.py --model prints the
same list for TRL).

Completion lengths (`--lengths`):
- `fixed` (default): every completion has exactly `completion_len` = T tokens (min_dec_len = max_dec_len), no EOS.
- `uniform:MIN`: row i of a rollout gets length l_i, an integer uniform on [MIN, T] (both included, EOS counted),
  drawn by `numpy.random.default_rng(key_i)` from the row's sampling key (`sampling.row_keys(seed, step, row)`, so
  independent per step and row and the same in every run). The policy's `generate` is wrapped: it decodes max_i l_i
  tokens for every row with EOS suppressed (min_new_tokens = max_new_tokens = max_i l_i), then cuts row i at l_i:
  EOS at position l_i - 1, pad after, completion_mask = 1 on the first l_i tokens, lengths = l_i, not truncated, the
  batch max_i l_i wide. The trainer's later phases see exactly what a rollout ending at EOS gives them. The rollout
  costs what a real one with these lengths costs (rollout.decode keeps finished rows in the batch and stops when the
  longest row ends, i.e. max_i l_i decode steps for all rows); only the EOS is placed instead of sampled (its
  sample log-prob is that of the token sampled there; the bench is on-policy with kl_coeff 0, so it is unused).
  The mean, min and max completion length over the timed steps are reported.

Prints ONE JSON line: medians over the timed steps of the step time (wall and process CPU) and of each phase,
completion tokens per second (completion tokens of a step / step time), the GFLOP each phase's matrix products
execute and the rate achieved (for the batch width actually run), the peak RSS of the process and per phase, the
paddle version and the thread count, and `kernels`: the CPU (vendor, model, vector ISA) and the kernel code paths
this process got there (`paddle_grpo.cpu_tuning.kernel_report`: MKL's path, numpy's SIMD level and OpenBLAS core,
transparent huge pages), so that lines from two machines say what differed. With `--repeat R` the whole benchmark
runs R times in fresh processes; the line then carries the median of the runs' medians, each run's step median, the
overall min/max step and, per phase, the largest RSS figures of the runs.

The rollout's float32 floor (docs/PERFORMANCE.md, "Generation"), beside `rollout_s_median`:
`rollout_floor_s` = (`rollout_prompt_tokens` + `rollout_sampled_tokens`) x `matmul_mflop_per_token` /
`gemm_gflop_per_s_best`, and `rollout_floor_ratio` = rollout_s_median / rollout_floor_s; `_1thread` keys give the
same at the 1-thread rate. Prompt tokens count once per prompt (medians over the timed steps of the step's prompts'
tokens: the G samples of a prompt share its prefill); sampled tokens are the completion tokens of the step (tool
turns included with --turns: they pass through the model too). FLOPs per token: every projection weight of every
layer and the LM head's V x D, multiply-add = 2 (`matmul_flop_per_token`; attention's score and value products are
not in the floor). The GEMM rate is `--gemm`'s best (`gemm_peak`), measured in this process at the run's threads and
at 1 thread before the trainer starts (about 10 s; then its matrices' heap pages are given back: on tiny.json the RSS
before the steps came out 15 MB above a run given the rate, the peak RSS the same), or given with `--gemm-rate
[THREADS=]GFLOPS` (`gemm_rate_measured` says which). A summary line with both floors goes to stderr.

Peak RSS per phase (`peak_rss_mb_by_phase`, `rss_increase_mb_by_phase`): the kernel's high-water mark (VmHWM),
read and reset at every phase boundary (`RssMonitor`; exact, no sampling thread). Phases are marked by wrapping,
for the run, the step/ functions the trainer calls: `rollout` = step.rollout (generation only), `logprob` =
step.logprobs when the trainer calls it itself (the off-policy old log-probs; absent on-policy), `reference` =
step.reference_logprobs, `update` = step.update (the policy's), `value` = step.values (the critic's values of the
experience, `--algorithm ppo`/`vapo`), `critic_update` = step.update_critic, `step` = the whole train_step. For each:
the largest RSS during
the phase, and the largest increase over the RSS at the phase's start, both the maximum over all steps, warm-up
included (paddle's allocator keeps what it got, so later steps mostly reuse memory and the increase shows in the
first step). With `warmup_steps` 0 the one timed step is the first: the optimizer's moments are created at its end,
so its peak can be below the steady state's.
`peak_rss_mb` is the process's high-water mark, model building included.

Switches for before/after measurements: `--fast off` (PaddleNLP's forward everywhere, PADDLE_GRPO_FAST=0) and
`--cpu-tuning off` (no paddle_grpo/cpu_tuning.py settings, PADDLE_GRPO_CPU_TUNING=0).

Phases (times): `rollout`, `reward`, `reference` and `value` are the trainer's perf/* timings; `logprob` is
perf/logprob_s (the reference pass and, off-policy only, the old-policy pass) without perf/reference_s;
`critic_update` is the wall time of step.update_critic (timed by the hook) and `update` perf/update_s without it
(the trainer's perf/update_s spans both updates). `other` = step - the phases (advantages, metrics, bookkeeping).

`--algorithm ppo` (or vapo): rl_algorithm ppo with a critic (`critic_model_name_or_path`) loaded from the same
random model directory: its backbone and a new value head (initialised to zeros), its own AdamW; the critic's
micro-batches are the policy's. Compare with the default (grpo) run of the same shape to see what the critic costs.
Left out: evaluation, checkpoints, logging to disk and the reward server (see tools/bench/bench_reward_server.py).

`--config async_rollout=true` (docs/async.md; `rollout_lag=N` too): the rollout and its reward run in the rollout
worker process while the trainer updates (and, with `beta > 0`, the reference pass: `rollout_worker_reference`). The
worker inherits `--threads` (OMP_NUM_THREADS): on 2 cores give `--threads 1`, one core each. `rollout_s_median` /
`reward_s_median` are then the worker's and overlap the step (so does `reference_s_median` when the worker computes
the reference log-probs: `rollout_worker_reference`); `other` leaves them out and the trainer's wait for them is
`wait_for_samples_s_median`. Extra keys: `worker_wait_for_weights_s_median`, `staleness_max`, `trainer_busy` /
`worker_busy` (each process's CPU time over the wall time of the timed steps: 1.0 is one core kept busy). Not with
`--lengths uniform` or `--turns` (they script the trainer process's policy).

`--turns K` (or SHAPE.json `turns`; 1 = the single-turn step above): a multi-turn step with the built-in
`calculator` (config `tools: [calculator]`, `max_turns: K`, `min_dec_len: 0`; `--tool python` calls the `python`
tool instead, `print(123*45)`: a subprocess per call, at most `tool_max_workers` at once). A random model does not write tool
calls, so its choices are scripted: the policy's stepper (its real one, `causal.stepper_for`) runs every step as
usual and then pushes its logits 1e4 down everywhere but the script's next token (`ScriptedStepper`), so each
sample writes K - 1 calls `<tool_call>{"name": "calculator", "arguments": {"expression": "123*45"}}</tool_call>`
(each ending at EOS: the character tokenizer has no single-token call-end marker), gets the calculator's tool
turn fed back (forced tokens, the KV cache kept), and ends with "The answer is 5535.". The rollout costs what a
real multi-turn rollout of these lengths costs, plus one [rows, V] add per step. `completion_len` must hold the
K - 1 calls, their tool turns and the answer (about 150 tokens for K = 2, 280 for K = 3; the bench says how many
when it is short). Extra keys, medians over the timed steps: `rollout_decode_s_median` (the model's prefill and
decode steps inside the rollout: Rollout.tool_stats.model_s), `rollout_tool_wait_s_median` (blocked with every
unfinished row waiting for a tool), `rollout_sampling_s_median` (the rest of the rollout: sampling maths, the
loop's bookkeeping, reading turns), `tool_latency_s_median` (per call, over all calls), `turns_per_sample`,
`tool_calls_per_step`, `tool_tokens_per_step` and `decode_steps_median`.
"""
import argparse
import contextlib
import dataclasses
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "prompt_len",
        "completion_len", "prompts_per_step", "group_size", "beta", "warmup_steps", "timed_steps")
PHASES = ("rollout", "reward", "logprob", "reference", "value", "update", "critic_update", "other")
RSS_PHASES = ("rollout", "logprob", "reference", "value", "update", "critic_update")  # step/ functions wrapped
# step/ function -> phase label (module docstring); values / update_critic run only with a critic (--algorithm ppo)
HOOKED = {"rollout": "rollout", "logprobs": "logprob", "reference_logprobs": "reference", "values": "value",
          "update": "update", "update_critic": "critic_update"}
ALGORITHMS = ("grpo", "ppo", "vapo")
# --model: the SHAPE.json keys the model directory decides (its config.json and the rendered prompts)
MODEL_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
              "prompt_len")
MODEL_PROMPTS = REPO / "data" / "smollm2_add" / "train.jsonl"


def char_reward(prompts, completions, **kwargs):
    """Share of lowercase vowels in the completion: cheap, and varies between samples of a random policy."""
    return [sum(c in "aeiou" for c in text) / max(1, len(text)) for text in completions]


def load_shape(path):
    with open(path) as f:
        shape = json.load(f)
    missing = [k for k in KEYS if k not in shape]
    if missing:
        raise SystemExit(f"{path}: missing keys {missing} (a SHAPE.json needs {list(KEYS)})")
    check_turns(shape.get("turns", 1), path)
    if shape.get("tool", "calculator") not in TOOL_ARGUMENTS:
        raise SystemExit(f"{path}: tool must be one of {sorted(TOOL_ARGUMENTS)}, got {shape['tool']!r}")
    if not isinstance(shape.get("config", {}), dict):
        raise SystemExit(f"{path}: 'config' must be a dict of trainer config keys, got {shape['config']!r}")
    return shape


def parse_lengths(spec, completion_len):
    """`--lengths` / SHAPE.json `lengths`: "fixed" -> None; "uniform:MIN" -> MIN (1 <= MIN <= completion_len)."""
    if spec in (None, "fixed"):
        return None
    kind, _, low = str(spec).partition(":")
    if kind != "uniform" or not low.isdigit() or not 1 <= int(low) <= completion_len:
        raise SystemExit(f"lengths: expected 'fixed' or 'uniform:MIN' with 1 <= MIN <= completion_len "
                         f"({completion_len}), got {spec!r}")
    return int(low)


def draw_lengths(keys, low, high):
    """Completion length of each row, uniform on [low, high], from its sampling key (row_keys): [n] int64."""
    return np.array([np.random.default_rng(int(k)).integers(low, high + 1) for k in keys], dtype=np.int64)


def check_turns(turns, where):
    if not isinstance(turns, int) or isinstance(turns, bool) or turns < 1:
        raise SystemExit(f"{where}: turns must be an integer >= 1 (1: single-turn), got {turns!r}")


# The scripted call of each tool (`--tool`): its arguments as JSON; both compute 123*45.
TOOL_ARGUMENTS = {"calculator": {"expression": "123*45"}, "python": {"code": "print(123*45)"}}
ANSWER = "The answer is 5535."


def call_text(tool="calculator"):
    return f'<tool_call>\n{{"name": "{tool}", "arguments": {json.dumps(TOOL_ARGUMENTS[tool])}}}\n</tool_call>'


CALL = call_text()


def turn_script(tokenizer, turns, tool="calculator"):
    """The scripted multi-turn completion (module docstring): (segments, tool_end, tokens). segments: the action
    token ids of each assistant turn (turns - 1 calls of `tool`, then the answer, each ending at EOS); tool_end: the
    ids that end a tool turn (the next assistant turn opened); tokens: the completion's length, tool turns included
    (the tool is run once here for its output)."""
    from paddle_grpo.data import tokenize_prompts
    from paddle_grpo.environment import HermesFormat, get_tool

    fmt, eos, text = HermesFormat(), tokenizer.eos_token_id, call_text(tool)
    call, answer = (tokenize_prompts(tokenizer, [t])[0] + [eos] for t in (text, ANSWER))
    if tokenizer.decode(call[:-1]) != text:
        raise SystemExit(f"turns > 1: the call text needs every printable ASCII character in the vocabulary "
                         f"(vocab_size >= 128), got vocab_size {len(tokenizer)}")
    result = get_tool(tool).call(TOOL_ARGUMENTS[tool])
    if result.error:
        raise SystemExit(f"--tool {tool}: the scripted call failed: {result.content}")
    tool_turn = tokenize_prompts(tokenizer, [fmt.tool_turn_text([result], False)])[0]
    tool_end = tokenize_prompts(tokenizer, [f"{fmt.turn_start}assistant\n"])[0]
    return [call] * (turns - 1) + [answer], tool_end, (turns - 1) * (len(call) + len(tool_turn)) + len(answer)


def check_turn_budget(shape, tokenizer):
    """SystemExit unless completion_len holds the script of `turns` turns (module docstring)."""
    turns = shape.get("turns", 1)
    need = turn_script(tokenizer, turns, shape.get("tool", "calculator"))[2]
    if shape["completion_len"] < need:
        raise SystemExit(f"turns {turns}: completion_len must hold {need} tokens (the calls, their tool turns and "
                         f"the answer), got {shape['completion_len']}; e.g. --set completion_len={need}")


def scripted_stepper(base, segments, tool_end):
    """A subclass of the stepper class `base` whose logits force each row through `segments` (module docstring):
    the real forward runs, then every logit but the script's next token's is lowered by 1e4. A row's position in
    the script follows the tokens it appends: its actions, then (tool mode) the fed tool turn until it ends with
    `tool_end`, which starts the next segment."""
    import paddle

    class ScriptedStepper(base):
        def start(self, prompt_ids, prompt_mask, G, max_new_tokens):
            logits = super().start(prompt_ids, prompt_mask, G, max_new_tokens)
            n = logits.shape[0]
            self.segment, self.offset = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
            self.acting, self.tail = np.ones(n, dtype=bool), [[] for _ in range(n)]
            return self.force(logits)

        def step(self, token, keep=None):
            logits = super().step(token, keep)
            ids = token.numpy()
            for i in np.flatnonzero(np.ones(len(ids), bool) if keep is None else keep.numpy()):
                if self.acting[i]:
                    self.offset[i] += 1
                    if self.offset[i] == len(segments[min(self.segment[i], len(segments) - 1)]):
                        self.acting[i], self.tail[i] = False, []
                else:
                    self.tail[i] = (self.tail[i] + [int(ids[i])])[-len(tool_end):]
                    if self.tail[i] == tool_end:
                        self.acting[i], self.segment[i], self.offset[i] = True, self.segment[i] + 1, 0
            return self.force(logits)

        def force(self, logits):
            nxt = [segments[min(k, len(segments) - 1)][min(j, len(segments[min(k, len(segments) - 1)]) - 1)]
                   for k, j in zip(self.segment, self.offset)]
            push = paddle.full_like(logits, -1e4)
            push = paddle.put_along_axis(push, paddle.to_tensor(nxt, dtype="int64").unsqueeze(-1),
                                         paddle.zeros([len(nxt), 1], dtype=logits.dtype), axis=1)
            return logits + push

    return ScriptedStepper


def scripted_turns(policy, tokenizer, turns, tool="calculator"):
    """Wrap `policy.generate` (on this instance) so that multi-turn rollouts run through `scripted_stepper`; returns
    the list each call's Rollout is appended to (for its turns and tool_stats)."""
    from paddle_grpo.policy.causal import stepper_for

    segments, tool_end, _ = turn_script(tokenizer, turns, tool)
    original, rollouts = policy.generate, []

    def generate(prompt_ids, prompt_mask, **kwargs):
        if kwargs.get("tools") is not None:
            kwargs["stepper"] = scripted_stepper(stepper_for(policy.model), segments, tool_end)
        out = original(prompt_ids, prompt_mask, **kwargs)
        rollouts.append(out)
        return out

    policy.generate = generate
    return rollouts


def turn_stats(rollouts, rollout_s):
    """Medians over the timed steps of the multi-turn rollout's parts (module docstring). rollouts: one Rollout per
    timed step; rollout_s: the steps' perf/rollout_s."""
    decode = [r.tool_stats.model_s for r in rollouts]
    wait = [r.tool_stats.wait_s for r in rollouts]
    calls = [m for r in rollouts for t in r.turns for m in t if m["role"] == "tool"]
    return {
        "rollout_decode_s_median": statistics.median(decode),
        "rollout_tool_wait_s_median": statistics.median(wait),
        "rollout_sampling_s_median": statistics.median(s - d - w for s, d, w in zip(rollout_s, decode, wait)),
        "tool_latency_s_median": statistics.median(m["latency_s"] for m in calls) if calls else 0.0,
        "tool_errors": sum(m["error"] is not None for m in calls),
        "turns_per_sample": statistics.mean(sum(m["role"] == "assistant" for m in t) for r in rollouts
                                            for t in r.turns),
        "tool_calls_per_step": statistics.median(sum(m["role"] == "tool" for t in r.turns for m in t)
                                                 for r in rollouts),
        "tool_tokens_per_step": statistics.median(int(r.tool_mask.numpy().sum()) for r in rollouts),
        "decode_steps_median": statistics.median(r.tool_stats.steps for r in rollouts),
        "truncated_samples": int(sum(r.truncated.sum() for r in rollouts)),
    }


def cut_rollout(rollout, lengths, eos_id, pad_id):
    """The rollout with row i ending at EOS after lengths[i] tokens (module docstring); its width is unchanged."""
    import paddle

    ids = rollout.completion_ids.numpy()
    cols = np.arange(ids.shape[1])[None, :]
    last = lengths[:, None] - 1
    ids = np.where(cols < last, ids, np.where(cols == last, eos_id, pad_id))
    mask = (cols <= last).astype("int64")
    logps = rollout.sample_logprobs * paddle.to_tensor(mask.astype("float32"))
    return dataclasses.replace(rollout, completion_ids=paddle.to_tensor(ids, dtype="int64"),
                               completion_mask=paddle.to_tensor(mask), sample_logprobs=logps,
                               lengths=lengths.copy(), truncated=np.zeros(len(lengths), dtype=bool))


def variable_lengths(policy, low):
    """Wrap `policy.generate` (on this instance) so that completions end at EOS with lengths drawn by draw_lengths;
    returns the list each call's drawn lengths [n] are appended to."""
    original, drawn = policy.generate, []

    def generate(prompt_ids, prompt_mask, *, row_keys=None, **kwargs):
        if row_keys is None:
            raise ValueError("variable lengths are drawn from the trainer's row_keys; generate got none")
        lengths = draw_lengths(row_keys, low, kwargs["max_new_tokens"])
        longest = int(lengths.max())
        out = original(prompt_ids, prompt_mask, row_keys=row_keys,
                       **{**kwargs, "max_new_tokens": longest, "min_new_tokens": longest})
        assert out.completion_ids.shape[1] == longest and (out.lengths == longest).all(), "EOS was not suppressed"
        drawn.append(lengths)
        return cut_rollout(out, lengths, kwargs["eos_token_ids"][0], kwargs["pad_token_id"])

    policy.generate = generate
    return drawn


class RssMonitor:
    """Peak resident set size per phase, from the kernel's own high-water mark: at each phase boundary the current
    VmHWM (/proc/self/status) is credited to every open phase and to the process peak, then reset to the current
    RSS (`5` written to /proc/self/clear_refs, Linux >= 4.0). Exact, and nothing runs between boundaries: the
    earlier sampling thread (every 2 ms) cost ~5 % of the toy shape's step time, by waking into the GIL and the
    cores paddle's kernels use. `phase(name)` opens one (nested phases are tracked independently). Where
    clear_refs cannot be written, `resettable` is False and each phase's peak is the process peak so far."""

    def __init__(self):
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.fd = os.open("/proc/self/statm", os.O_RDONLY)
        self.open = {}                  # name -> [rss at start, peak so far] in bytes
        self.records = {}               # name -> [(start, peak)] in MB, one per completed phase
        self.process_peak = self.high_water_mark()
        self.resettable = self._reset()

    def rss(self):
        return int(os.pread(self.fd, 256, 0).split()[1]) * self.page

    @staticmethod
    def high_water_mark():
        """VmHWM in bytes: the peak RSS since the process started or since the last reset."""
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) * 1024

    def _credit(self):
        hwm = self.high_water_mark()
        self.process_peak = max(self.process_peak, hwm)
        for entry in self.open.values():
            entry[1] = max(entry[1], hwm)

    def _reset(self):
        """Credit the peak so far, then restart the high-water mark from the current RSS."""
        self._credit()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    @contextlib.contextmanager
    def phase(self, name):
        self._reset()
        rss = self.rss()
        self.open[name] = [rss, rss]
        try:
            yield
        finally:
            self._reset()
            start, peak = self.open.pop(name)
            self.records.setdefault(name, []).append((start / 2**20, peak / 2**20))

    def peak_mb(self):
        """The process's peak RSS in MB, model building included (getrusage's ru_maxrss follows the resets)."""
        self._credit()
        return self.process_peak / 2**20

    def close(self):
        os.close(self.fd)

    def summary(self):
        """{"peak_rss_mb_by_phase": {phase: max peak}, "rss_increase_mb_by_phase": {phase: max(peak - start)}}."""
        return {"peak_rss_mb_by_phase": {k: max(p for _, p in v) for k, v in self.records.items()},
                "rss_increase_mb_by_phase": {k: max(p - s for s, p in v) for k, v in self.records.items()}}


@contextlib.contextmanager
def phase_hooks(monitor, times=None):
    """Wrap the step/ functions of HOOKED in `monitor.phase` for the duration (only the outermost of nested
    calls counts: step.reference_logprobs calls step.logprobs); restored afterwards. With `times` (a dict), each
    outermost call's wall time is also added to `times[label]` (the critic's update has no perf/* timing of its
    own: perf/update_s holds the policy's and the critic's updates)."""
    from paddle_grpo import step

    originals = {name: getattr(step, name) for name in HOOKED if hasattr(step, name)}
    depth = [0]

    def wrap(label, fn):
        def wrapped(*args, **kwargs):
            if depth[0]:
                return fn(*args, **kwargs)
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                with monitor.phase(label):
                    return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
                if times is not None:
                    times[label] = times.get(label, 0.0) + time.perf_counter() - t0
        return wrapped

    labels = HOOKED
    # Each function is replaced in the package (what the trainer calls) and in its own phase module (what the
    # other phases call: collect calls rollout, reference_logprobs calls logprobs).
    homes = [step] + [sys.modules[fn.__module__] for fn in originals.values()]
    patched = [(home, name, fn) for name, fn in originals.items() for home in dict.fromkeys(homes)
               if getattr(home, name, None) is fn]
    try:
        for home, name, fn in patched:
            setattr(home, name, wrap(labels[name], fn))
        yield
    finally:
        for home, name, fn in patched:
            setattr(home, name, fn)


def build(shape, workdir, seed=0):
    """Tokenizer + random model in workdir/model, prompts in workdir/train.jsonl. Returns (model_dir, data_file)."""
    import random

    from paddle_grpo.recipes.tiny import CHAR_ALPHABET, build_char_tokenizer, build_model

    model_dir = os.path.join(workdir, "model")
    tokenizer = build_char_tokenizer(model_dir, shape["vocab_size"])
    assert len(tokenizer) == shape["vocab_size"]
    build_model(model_dir, tokenizer, hidden_size=shape["hidden_size"],
                intermediate_size=shape["intermediate_size"], num_layers=shape["num_layers"],
                num_heads=shape["num_heads"], num_kv_heads=shape["num_kv_heads"],
                max_position_embeddings=shape["prompt_len"] + shape["completion_len"], seed=seed)
    # Letters and digits only: one token each, so a prompt of prompt_len characters is prompt_len tokens.
    letters = [c for c in CHAR_ALPHABET[:shape["vocab_size"] - 3] if c.isalnum()]
    rng = random.Random(seed)
    n = shape["prompts_per_step"] * (shape["warmup_steps"] + shape["timed_steps"])
    data = os.path.join(workdir, "train.jsonl")
    with open(data, "w") as f:
        for _ in range(n):
            text = "".join(rng.choice(letters) for _ in range(shape["prompt_len"]))
            f.write(json.dumps({"src": text, "tgt": ""}) + "\n")
    return model_dir, data


def chat_questions(n: int, path: "os.PathLike | str" = MODEL_PROMPTS) -> "list[str]":
    """The first `n` user questions of the JSONL file `path` (--model's prompts, shared with tools/bench/trl_bench.py):
    the content of the last user turn of a ChatML-templated `src`, or the `src` itself when it is not templated."""
    questions = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if len(questions) == n:
                break
            src = json.loads(line)["src"]
            if "<|im_start|>user\n" in src:
                src = src.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
            questions.append(src)
    if len(questions) < n:
        raise SystemExit(f"{path}: {len(questions)} prompts, the shape needs prompts_per_step x (warmup_steps + "
                         f"timed_steps) = {n}")
    return questions


def model_shape(shape: dict, model_dir: str) -> "tuple[dict, dict]":
    """(shape with the model's sizes from `model_dir`/config.json, {ignored key: its SHAPE.json value}) for --model;
    `prompt_len` is left to the caller (the longest rendered prompt). No paddle: tools/bench/trl_bench.py uses it
    too."""
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path) as f:
            config = json.load(f)
        sizes = {"vocab_size": config["vocab_size"], "hidden_size": config["hidden_size"],
                 "intermediate_size": config["intermediate_size"], "num_layers": config["num_hidden_layers"],
                 "num_heads": config["num_attention_heads"],
                 "num_kv_heads": config.get("num_key_value_heads") or config["num_attention_heads"]}
    except (OSError, json.JSONDecodeError, KeyError) as e:
        raise SystemExit(f"--model {model_dir}: cannot read the model's sizes from {path} ({e!r})")
    ignored = {k: shape[k] for k in MODEL_KEYS if k in shape}
    return {**shape, **sizes}, ignored


def build_from_model(shape: dict, model_dir: str, workdir: str) -> "tuple[str, dict, dict, list[int]]":
    """--model: the prompts in workdir/train.jsonl (chat_questions, raw: the trainer applies the chat template).
    Returns (data_file, shape with the model's sizes and prompt_len = the longest prompt, ignored SHAPE.json keys,
    each prompt's token count as the trainer's encoding gives it)."""
    from paddle_grpo.data import apply_chat_template, tokenize_prompts
    from paddle_grpo.policy import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    if not getattr(tokenizer, "chat_template", None):
        raise SystemExit(f"--model {model_dir}: its tokenizer has no chat template (tokenizer_config.json "
                         "'chat_template'); the benchmark renders its prompts with the model's own")
    n = shape["prompts_per_step"] * (shape["warmup_steps"] + shape["timed_steps"])
    questions = chat_questions(n)
    texts = [apply_chat_template(q, tokenizer=tokenizer, mode="auto") for q in questions]
    prompt_tokens = [len(ids) for ids in tokenize_prompts(tokenizer, texts)]
    shape, ignored = model_shape(shape, model_dir)
    shape["prompt_len"] = max(prompt_tokens)
    data = os.path.join(workdir, "train.jsonl")
    with open(data, "w") as f:
        for q in questions:
            f.write(json.dumps({"src": q, "tgt": ""}) + "\n")
    return data, shape, ignored, prompt_tokens


def make_config(shape, model_dir, data, workdir, seed=0, algorithm="grpo", chat_template="none"):
    """The trainer config of the bench. `algorithm` ppo / vapo: that estimator, with a critic loaded from the same
    random model directory (a causal LM: its backbone and a new value head, policy/critic.py), its micro-batches
    (per_device_value_batch_size) the policy's; vapo's pretrain_critic_steps is set to 0, so every step is a full
    one, and its positive examples are the completions of char_reward >= 0.5 (char_reward declares no maximum)."""
    from paddle_grpo.config import config_from_dict

    n_seq = shape["prompts_per_step"] * shape["group_size"]
    micro = shape.get("micro_batch_size", n_seq)
    critic = {} if algorithm == "grpo" else dict(critic_model_name_or_path=model_dir, per_device_value_batch_size=micro,
                                                 critic_learning_rate=1e-5, pretrain_critic_steps=0,
                                                 positive_example_min_reward=0.5)
    turns = shape.get("turns", 1)  # multi-turn: the calculator, no minimum length (EOS ends each turn)
    tools = {} if turns == 1 else dict(tools=[shape.get("tool", "calculator")], max_turns=turns, min_dec_len=0)
    # SHAPE.json's `config` overrides the keys below (a later `**` of the same key would be a TypeError).
    return config_from_dict({**dict(
        actor_model_name_or_path=model_dir, use_rm_server=False, reward_funcs=f"{os.path.abspath(__file__)}:char_reward",
        train_datasets=data, output_dir=os.path.join(workdir, "out"), logging_dir=os.path.join(workdir, "vdl"),
        report_to="none", save_strategy="no", disable_tqdm=True, chat_template=chat_template, seed=seed,
        max_prompt_len=shape["prompt_len"], max_dec_len=shape["completion_len"], min_dec_len=shape["completion_len"],
        max_length=shape["prompt_len"] + shape["completion_len"], temperature=1.0, top_p=1.0,
        global_batch_size=shape["prompts_per_step"], rollout_n=shape["group_size"], rollout_max_num_seqs=n_seq,
        per_device_train_batch_size=micro, per_device_logprob_batch_size=micro, learning_rate=1e-5,
        max_steps=shape["warmup_steps"] + shape["timed_steps"], kl_coeff=0.0, kl_loss_coeff=shape["beta"],
        entropy_coeff=0.0, rl_algorithm=algorithm, **critic), **tools, **shape.get("config", {})})


def flops(shape, shared, critic=False):
    """Floating-point operations (multiply-add = 2) the matrix products of one step execute, per phase, in GFLOP.

    Dense layers, the LM head on the positions that need it, and attention over all keys a query sees (masked ones
    included, as they are computed). `shared`: the fast path, which runs each group's prompt once and does not feed
    the last completion token; else PaddleNLP's forward over all `N x (L + T)` tokens. The update is counted as 3x
    its forward (backward = input and weight gradients). Elementwise ops and softmax are left out. `critic`: also
    the critic's values pass (`value`: the policy's backbone pass, shared or not as the policy's, then a [D, 1]
    head instead of the LM head; policy/critic.py) and its update (`critic_update`, 3x that).
    """
    D, I, V, layers = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"], shape["num_layers"]
    H, KV = shape["num_heads"], shape["num_kv_heads"]
    d = D // H
    L, T, P, G = shape["prompt_len"], shape["completion_len"], shape["prompts_per_step"], shape["group_size"]
    N = P * G
    dense = 2 * layers * (D * (H + 2 * KV) * d + H * d * D + 3 * D * I)   # per token
    attn = 4 * layers * H * d                                             # per (query, key) pair
    head = 2 * D * V                                                      # per predicted token
    if shared:
        body = (P * L + N * (T - 1)) * dense + (P * L * L + N * (T - 1) * (L + T - 1)) * attn
    else:
        body = N * (L + T) * dense + N * (L + T) ** 2 * attn
    fwd = body + N * T * head
    # Rollout: prefill the P prompts once, then T - 1 decode steps of N rows (the fast path's preallocated cache
    # attends to all L + T slots; PaddleNLP's to the L + t filled ones).
    decode_keys = (T - 1) * (L + T) if shared else sum(L + t for t in range(1, T))
    rollout = P * L * dense + P * L * L * attn + P * head + N * ((T - 1) * (dense + head) + decode_keys * attn)
    out = {"rollout": rollout / 1e9, "reference": fwd / 1e9 if shape["beta"] > 0 else 0.0, "update": 3 * fwd / 1e9}
    if critic:  # the same backbone pass (the critic takes the lean path when the policy does), a [D, 1] head
        value = body + N * T * 2 * D
        out.update(value=value / 1e9, critic_update=3 * value / 1e9)
    return out


def gemm_peak(threads, repeat=20):
    """Best fp32 GEMM rate of paddle.matmul at four shapes, GFLOP/s (the hardware/library ceiling for the bench);
    `gemm_gflop_per_s_best` is the highest of them (the rate of the generation floor, `matmul_flop_per_token`)."""
    import paddle

    from paddle_grpo import cpu_tuning

    cpu_tuning.apply()
    paddle.base.core.set_num_threads(threads)
    out = {}
    rng = np.random.default_rng(0)  # not paddle.randn: measured inside a run, it must not move paddle's generator
    for m, k, n in ((4096, 256, 704), (2272, 256, 1408), (32, 256, 1408), (1024, 1024, 1024)):
        a, b = (paddle.to_tensor(rng.standard_normal(s, dtype=np.float32)) for s in ((m, k), (k, n)))
        paddle.matmul(a, b)
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(repeat):
                c = paddle.matmul(a, b)
            float(c[0, 0])
            best = min(best, (time.perf_counter() - t0) / repeat)
        out[f"{m}x{k}x{n}"] = 2 * m * k * n / best / 1e9
    return {"gemm_gflop_per_s": out, "gemm_gflop_per_s_best": max(out.values()), "threads": threads,
            "paddle_version": paddle.__version__,
            "cpu_tuning": cpu_tuning.apply(), "kernels": cpu_tuning.kernel_report(),
            "load_average": list(os.getloadavg())}


def matmul_flop_per_token(shape: dict) -> int:
    """Floating-point operations (multiply-add = 2) of the matrix products one token costs through the model: every
    projection weight of every layer (q, k, v, o, gate, up, down) and the LM head's V x D (the floor's count; 269 MFLOP
    for SmolLM2-135M). Attention's score and value products are left out: they grow with the context, not with the
    weights. `shape`: SHAPE.json's model sizes (model_shape gives a model directory's)."""
    D, I, V, layers = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"], shape["num_layers"]
    H, KV = shape["num_heads"], shape["num_kv_heads"]
    d = D // H
    per_layer = D * H * d + 2 * D * KV * d + H * d * D + 3 * D * I   # q, k + v, o, gate + up + down
    return 2 * (layers * per_layer + V * D)


def generation_floor_s(prompt_tokens: float, sampled_tokens: float, flop_per_token: float,
                       gflop_per_s: float) -> float:
    """The float32 floor of a generation, in seconds: (prompt tokens + sampled tokens) x matmul FLOPs per token at
    the best GEMM rate. Prompt tokens count once per prompt (the samples of a prompt share its prefill)."""
    return (prompt_tokens + sampled_tokens) * flop_per_token / (gflop_per_s * 1e9)


def parse_gemm_rates(specs: "list[str]", threads: "list[int]") -> "dict[int, float]":
    """`--gemm-rate` values -> {threads: GFLOP/s}. "T=GFLOPS" gives the rate at T threads; a bare "GFLOPS" the rate
    at the run's thread count (only when the run has one)."""
    rates = {}
    for spec in specs:
        t, sep, value = spec.rpartition("=")
        try:
            key, rate = (int(t) if sep else None), float(value)
        except ValueError:
            raise SystemExit(f"--gemm-rate: expected GFLOPS or THREADS=GFLOPS, got {spec!r}")
        if key is None:
            if len(threads) != 1:
                raise SystemExit(f"--gemm-rate {spec}: runs at {threads} threads; give THREADS=GFLOPS for each")
            key = threads[0]
        if rate <= 0 or key < 1:
            raise SystemExit(f"--gemm-rate {spec}: threads >= 1 and a positive rate expected")
        rates[key] = rate
    return rates


def gemm_rates(threads: "list[int]", given: "dict[int, float]") -> "tuple[dict[int, float], dict[int, bool]]":
    """({threads: best GEMM GFLOP/s}, {threads: measured here}) for every thread count of `threads`: `given`'s rate,
    else gemm_peak's best, measured in this process (it leaves paddle at the last count's threads)."""
    rates, measured = {}, {}
    for t in threads:
        measured[t] = t not in given
        rates[t] = given[t] if t in given else gemm_peak(t)["gemm_gflop_per_s_best"]
    return rates, measured


def release_heap() -> None:
    """Return glibc's free heap pages to the kernel (malloc_trim): cpu_tuning's mallopt keeps freed blocks in the heap,
    so the in-process GEMM measurement's matrices (~50 MB) would otherwise stay in the RSS the run reports."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing kept to give back
        pass


def floor_fields(flop_per_token: int, prompt_tokens: float, sampled_tokens: float, seconds: float, threads: int,
                 rates: "dict[int, float]", measured: "dict[int, bool]", prefix: str = "rollout_",
                 token_keys: "tuple[str, str]" = ("rollout_prompt_tokens", "rollout_sampled_tokens")) -> dict:
    """The floor keys of a JSON line: the token counts (named `token_keys`), FLOPs per token, the GEMM rates, and
    the floor and seconds / floor (`{prefix}floor_s`, `{prefix}floor_ratio`) at the run's thread count and at 1
    thread (`..._1thread`); a thread count without a rate in `rates` gets no floor keys."""
    out = {token_keys[0]: prompt_tokens, token_keys[1]: sampled_tokens, "matmul_mflop_per_token": flop_per_token / 1e6,
           "gemm_rate_measured": {str(t): m for t, m in measured.items()}}
    for suffix, t in (("", threads), ("_1thread", 1)):
        if t not in rates:
            continue
        floor = generation_floor_s(prompt_tokens, sampled_tokens, flop_per_token, rates[t])
        out.update({f"gemm_gflop_per_s_best{suffix}": rates[t], f"{prefix}floor_s{suffix}": floor,
                    f"{prefix}floor_ratio{suffix}": seconds / floor})
    return out


def floor_summary(result: dict, seconds_key: str = "rollout_s_median", prefix: str = "rollout_",
                  token_keys: "tuple[str, str]" = ("rollout_prompt_tokens", "rollout_sampled_tokens")) -> str:
    """One line for a person: the time beside its floor (at the run's threads and at 1 thread, where known)."""
    parts = [f"{seconds_key} {result[seconds_key]:.4g} s"]
    for suffix, where in (("", f"{result['threads']} thread(s)"), ("_1thread", "1 thread")):
        if f"{prefix}floor_s{suffix}" in result and not (suffix and result["threads"] == 1):
            parts.append(f"floor {result[f'{prefix}floor_s{suffix}']:.4g} s at {where} "
                         f"({result[f'gemm_gflop_per_s_best{suffix}']:.1f} GFLOP/s best GEMM), ratio "
                         f"{result[f'{prefix}floor_ratio{suffix}']:.2f}")
    parts.append(f"{result[token_keys[0]]:g} prompt + {result[token_keys[1]]:g} sampled tokens x "
                 f"{result['matmul_mflop_per_token']:.4g} MFLOP/token (matrix products only)")
    return "; ".join(parts)


def run(shape, threads, workdir, profile_dir=None, algorithm="grpo", model=None, given_rates=None):
    """One benchmark in this process (`model`: --model's directory, else a random one); returns the result dict.
    `given_rates`: --gemm-rate's {threads: GFLOP/s}; the others of the run's threads and 1 are measured here."""
    import paddle

    from paddle_grpo import cpu_tuning

    cpu_tuning.apply()  # also done by load_causal_lm; here first so that building the model is tuned as well
    paddle.base.core.set_num_threads(threads)
    from paddle_grpo.trainer import Trainer

    low = parse_lengths(shape.get("lengths"), shape["completion_len"])
    turns = shape.get("turns", 1)
    if turns > 1 and low is not None:
        raise SystemExit("turns > 1 scripts the completions' lengths: use lengths 'fixed'")
    if model is None:
        model_dir, data = build(shape, workdir)
    else:
        model_dir = os.path.abspath(model)
        data, shape, ignored, prompt_tokens = build_from_model(shape, model_dir, workdir)
    if turns > 1:
        from paddle_grpo.policy import load_tokenizer

        check_turn_budget(shape, load_tokenizer(model_dir))
    # The floor's GEMM rates, before the trainer exists (an asynchronous rollout worker would share the cores).
    rates, measured = gemm_rates(sorted({1, threads}), given_rates or {})
    paddle.base.core.set_num_threads(threads)
    if any(measured.values()):
        release_heap()
    trainer = Trainer(make_config(shape, model_dir, data, workdir, algorithm=algorithm,
                                  chat_template="none" if model is None else "auto"))
    overlap = {"wait": [], "weights": [], "staleness": []} if trainer.cfg.async_rollout else None
    if overlap is not None and (low is not None or turns > 1):  # both script the trainer process's policy
        raise SystemExit("async_rollout=true: the rollout runs in the worker process, which --lengths uniform and "
                         "--turns > 1 do not script; use lengths fixed and one turn")
    drawn = variable_lengths(trainer.policy, low) if low is not None else None
    turn_rollouts = (scripted_turns(trainer.policy, trainer.tokenizer, turns, shape.get("tool", "calculator"))
                     if turns > 1 else None)
    timed_rollouts = []
    per_step = {k: [] for k in ("step", "cpu") + PHASES}
    tokens, lengths, widths, mask_sums, ends_at_eos, prompt_counts = [], [], [], [], [], []
    profiler = None
    monitor = RssMonitor()
    rss_before = monitor.rss() / 2**20
    hooked_s = {}  # wall time of the hooked phases in the current step
    try:
        with phase_hooks(monitor, hooked_s):
            for s in range(shape["warmup_steps"] + shape["timed_steps"]):
                timed = s >= shape["warmup_steps"]
                if timed and profile_dir and profiler is None:
                    trace = paddle.profiler.export_chrome_tracing(profile_dir)
                    profiler = paddle.profiler.Profiler(targets=[paddle.profiler.ProfilerTarget.CPU],
                                                        on_trace_ready=trace)
                    profiler.start()
                if timed and s == shape["warmup_steps"] and overlap is not None:  # the timed steps' CPU shares
                    overlap["start"] = (time.perf_counter(), trainer.batches.cpu_seconds())
                cpu0 = time.process_time()
                hooked_s.clear()
                with monitor.phase("step"):
                    metrics = trainer.train_step()
                cpu = time.process_time() - cpu0
                if profiler is not None:
                    profiler.step()
                if not timed:
                    continue
                ref = metrics["perf/reference_s"]
                step = metrics["perf/step_s"]
                # The rollout worker's reference pass (rollout_worker_reference) is not in the trainer's logprob_s
                # and overlaps the step, as the worker's rollout does.
                worker_ref = trainer.cfg.reference_in_rollout_worker
                # perf/update_s spans the policy's and the critic's updates; perf/value_s is the critic's values
                critic_update = hooked_s.get("critic_update", 0.0)
                phases = {"rollout": metrics["perf/rollout_s"], "reward": metrics["perf/reward_s"],
                          "logprob": metrics["perf/logprob_s"] - (0.0 if worker_ref else ref), "reference": ref,
                          "value": metrics.get("perf/value_s", 0.0),
                          "update": metrics["perf/update_s"] - critic_update, "critic_update": critic_update}
                if overlap is not None:  # the worker's rollout and rewards overlap the step: it pays their wait
                    in_worker = ("rollout", "reward", "reference") if worker_ref else ("rollout", "reward")
                    phases["other"] = step - sum(v for k, v in phases.items() if k not in in_worker)
                    phases["other"] -= metrics["perf/wait_for_samples_s"]
                    overlap["wait"].append(metrics["perf/wait_for_samples_s"])
                    overlap["weights"].append(metrics["perf/worker_wait_for_weights_s"])
                    overlap["staleness"].append(metrics["rollout/staleness"])
                else:
                    phases["other"] = step - sum(phases.values())
                per_step["step"].append(step)
                per_step["cpu"].append(cpu)
                if turn_rollouts is not None:
                    timed_rollouts.append(turn_rollouts[-1])
                for k, v in phases.items():
                    per_step[k].append(v)
                batch = trainer.batch
                if model is not None:  # the trainer's prompts are the ones counted (in order, each G times)
                    P = shape["prompts_per_step"]
                    expect = np.repeat(prompt_tokens[s * P:(s + 1) * P], shape["group_size"])
                    got = batch.prompt_mask.numpy().sum(axis=1)
                    if sorted(got.tolist()) != sorted(expect.tolist()):
                        raise RuntimeError(f"step {s}: the batch's prompt lengths {got.tolist()} are not the "
                                           f"counted ones {expect.tolist()}")
                mask = batch.completion_mask.numpy()
                tokens.append(int(mask.sum()))
                # each prompt once: its G rows share the prefill
                prompt_counts.append(int(batch.prompt_mask.numpy().sum()) / shape["group_size"])
                lengths.extend(int(n) for n in batch.lengths)
                widths.append(mask.shape[1])
                mask_sums.append(mask.sum(axis=1).tolist())
                if drawn is not None:
                    ids, last = batch.completion_ids.numpy(), batch.lengths - 1
                    cols = np.arange(ids.shape[1])[None, :]
                    ends_at_eos.append(bool((ids[np.arange(len(ids)), last] == trainer.tokenizer.eos_token_id).all()
                                            and (ids[cols > last[:, None]] == trainer.tokenizer.pad_token_id).all()))
        if overlap is not None:
            wall0, cpu0 = overlap["start"]
            wall, cpu = time.perf_counter() - wall0, trainer.batches.cpu_seconds()
            overlap["busy"] = {name: (cpu[name] - cpu0[name]) / wall for name in cpu}
    finally:
        monitor.close()
        trainer.batches.close()  # the rollout worker, when async_rollout
    if profiler is not None:
        profiler.stop()
        profiler.summary(sorted_by=paddle.profiler.SortedKeys.CPUTotal, op_detail=True, thread_sep=False,
                         time_unit="ms")
    step_median = statistics.median(per_step["step"])
    from paddle_grpo.policy import fast_decoder

    fast = fast_decoder.enabled_for(trainer.policy.model)
    # The work actually run: batches max-length wide (padded rows included), the rollout decoding that many tokens.
    gflop = flops({**shape, "completion_len": int(statistics.median(widths))}, fast, critic=algorithm != "grpo")
    result = {
        "step_s_median": step_median,
        "step_s_min": min(per_step["step"]), "step_s_max": max(per_step["step"]),
        "completion_tokens_per_step": statistics.median(tokens),
        "completion_tokens_per_s": statistics.median(tokens) / step_median,
        "completion_len_mean": statistics.mean(lengths), "completion_len_min": min(lengths),
        "completion_len_max": max(lengths), "lengths": shape.get("lengths", "fixed"),
        **{f"{k}_s_median": statistics.median(per_step[k]) for k in PHASES},
        "step_cpu_s_median": statistics.median(per_step["cpu"]),
        "step_s_all": per_step["step"],
        "peak_rss_mb": monitor.peak_mb(),
        **monitor.summary(), "rss_mb_before_steps": rss_before,
        "paddle_version": paddle.__version__, "threads": threads,
        "gflop_per_step": gflop,
        **{f"{k}_gflop_per_s": gflop[k] / statistics.median(per_step[k]) for k in gflop if gflop[k] > 0},
        **floor_fields(matmul_flop_per_token(shape), statistics.median(prompt_counts), statistics.median(tokens),
                       statistics.median(per_step["rollout"]), threads, rates, measured),
        "fast_path": fast, "cpu_tuning": cpu_tuning.apply(), "kernels": cpu_tuning.kernel_report(),
        "algorithm": algorithm,
        "load_average": list(os.getloadavg()), "shape": shape,
    }
    if model is not None:
        result.update(model=model_dir, prompt_tokens=prompt_tokens, ignored_shape_keys=ignored)
    if overlap is not None:  # async_rollout: both waits (medians) and each process's CPU time / wall (timed steps)
        result.update(async_rollout=True, rollout_lag=trainer.cfg.rollout_lag,
                      wait_for_samples_s_median=statistics.median(overlap["wait"]),
                      worker_wait_for_weights_s_median=statistics.median(overlap["weights"]),
                      staleness_max=max(overlap["staleness"]), trainer_busy=overlap["busy"]["trainer"],
                      worker_busy=overlap["busy"]["rollout worker"])
    if turn_rollouts is not None:
        result.update(turns=turns, tool=shape.get("tool", "calculator"),
                      **turn_stats(timed_rollouts, per_step["rollout"]))
    if drawn is not None:  # the timed steps' drawn lengths and what the trainer's batch holds, row by row
        result.update(drawn_lengths_by_step=[d.tolist() for d in drawn[shape["warmup_steps"]:]],
                      mask_sums_by_step=mask_sums, completions_end_at_eos=all(ends_at_eos))
    return result


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--ops" in argv:  # per-op timings: tools/bench/bench_ops.py owns the remaining arguments
        sys.path.insert(0, str(REPO / "tools" / "bench"))
        import bench_ops

        return bench_ops.main([a for a in argv if a != "--ops"])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default=str(REPO / "tools" / "bench" / "shapes" / "default.json"))
    ap.add_argument("--threads", type=int, default=2, help="CPU threads for paddle's kernels (default 2)")
    ap.add_argument("--repeat", type=int, default=1, help="run the benchmark this many times, each in a fresh process")
    ap.add_argument("--fast", choices=("auto", "off"), default="auto",
                    help="auto: the lean decoder path where it applies (paddle_grpo/policy/fast_decoder.py); off: "
                         "PaddleNLP's forward everywhere (sets PADDLE_GRPO_FAST=0)")
    ap.add_argument("--cpu-tuning", choices=("on", "off"), default="on",
                    help="off: skip paddle_grpo/cpu_tuning.py (sets PADDLE_GRPO_CPU_TUNING=0)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a SHAPE.json key (e.g. --set completion_len=128)")
    ap.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                    help="override a trainer config key (SHAPE.json `config`), e.g. --config "
                         "use_fused_head_and_loss_fn=true; VALUE is JSON if it parses, else a string")
    ap.add_argument("--lengths", metavar="DIST", help="completion lengths: 'fixed' (default: all completion_len) or "
                                                      "'uniform:MIN' (each row uniform on [MIN, completion_len], "
                                                      "ending at EOS; module docstring)")
    ap.add_argument("--algorithm", choices=ALGORITHMS, default="grpo",
                    help="rl_algorithm of the steps; ppo / vapo add a critic loaded from the same random model "
                         "(phases value and critic_update)")
    ap.add_argument("--turns", type=int, metavar="K", help="multi-turn steps: K - 1 scripted calculator calls, then "
                                                         "the answer (SHAPE.json `turns`; module docstring)")
    ap.add_argument("--tool", choices=sorted(TOOL_ARGUMENTS), help="with --turns: the tool each scripted call uses "
                                                                     "(SHAPE.json `tool`; default calculator)")
    ap.add_argument("--model", metavar="DIR", help="a real model directory (its weights, tokenizer and chat "
                                                   "template) instead of a random model; SHAPE.json's model sizes "
                                                   "and prompt_len are then ignored (module docstring)")
    ap.add_argument("--gemm", action="store_true", help="only measure paddle's peak fp32 GEMM rate (JSON line)")
    ap.add_argument("--gemm-rate", action="append", default=[], metavar="[THREADS=]GFLOPS",
                    help="the best GEMM rate of the rollout floor (`--gemm`'s gemm_gflop_per_s_best) at the run's "
                         "threads, or at THREADS (repeat for 1 and the run's); the rest is measured before the steps")
    ap.add_argument("--ops", action="store_true", help="per-op timings (tools/bench/bench_ops.py; the other arguments "
                                                       "go to it)")
    ap.add_argument("--profile", metavar="DIR", help="paddle.profiler over the timed steps; summary to stdout "
                                                     "(before the JSON line), chrome trace to DIR")
    args = ap.parse_args(argv)
    shape = load_shape(args.shape)
    for kv in args.set:
        k, v = _key_value(kv, "--set")
        shape[k] = json.loads(v)
    for kv in args.config:
        k, v = _key_value(kv, "--config")
        shape["config"] = {**shape.get("config", {}), k: _json_or_str(v)}
    if args.lengths is not None:
        shape["lengths"] = args.lengths
    if args.turns is not None:
        check_turns(args.turns, "--turns")
        shape["turns"] = args.turns
    if args.tool is not None:
        shape["tool"] = args.tool
    parse_lengths(shape.get("lengths"), shape["completion_len"])  # a bad spec fails before any work
    given_rates = parse_gemm_rates(args.gemm_rate, [args.threads])
    if args.repeat > 1 and not args.gemm:
        result = _repeat(args, shape)
        print(floor_summary(result), file=sys.stderr, flush=True)
        print(json.dumps(result), flush=True)
        return
    # Thread pools are sized when paddle loads: set the environment before the import.
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    if args.fast == "off":
        os.environ["PADDLE_GRPO_FAST"] = "0"
    if args.cpu_tuning == "off":
        os.environ["PADDLE_GRPO_CPU_TUNING"] = "0"
    sys.path.insert(0, str(REPO))
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    if args.gemm:
        print(json.dumps(gemm_peak(args.threads)), flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="paddle_grpo_bench_") as workdir:
        result = run(shape, args.threads, workdir, profile_dir=args.profile, algorithm=args.algorithm,
                     model=args.model, given_rates=given_rates)
    print(floor_summary(result), file=sys.stderr, flush=True)  # stdout holds the JSON line alone
    print(json.dumps(result), flush=True)


def _key_value(kv, flag):
    if "=" not in kv:
        raise SystemExit(f"{flag}: expected KEY=VALUE, got {kv!r}")
    return kv.split("=", 1)


def _json_or_str(value):
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _repeat(args, shape):
    """Run the benchmark `args.repeat` times in fresh processes; medians of the per-run medians and their spread."""
    runs = []
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="bench_shape_") as f:
        json.dump(shape, f)  # the shape with every --set / --config / --lengths applied
        f.flush()
        for _ in range(args.repeat):
            cmd = [sys.executable, os.path.abspath(__file__), "--shape", f.name, "--threads", str(args.threads),
                   "--fast", args.fast, "--cpu-tuning", args.cpu_tuning, "--algorithm", args.algorithm]
            cmd += ["--model", args.model] if args.model else []
            cmd += [f"--gemm-rate={spec}" for spec in args.gemm_rate]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
    result = dict(runs[0])
    for key in [k for k in runs[0] if k.endswith(("_median", "_per_s")) or k == "peak_rss_mb"]:
        result[key] = statistics.median(r[key] for r in runs)
    for key in ("peak_rss_mb_by_phase", "rss_increase_mb_by_phase"):
        result[key] = {p: max(r[key][p] for r in runs) for p in runs[0][key]}
    result["step_s_median_runs"] = [r["step_s_median"] for r in runs]
    result["step_s_min"] = min(r["step_s_min"] for r in runs)
    result["step_s_max"] = max(r["step_s_max"] for r in runs)
    result["completion_len_min"] = min(r["completion_len_min"] for r in runs)
    result["completion_len_max"] = max(r["completion_len_max"] for r in runs)
    result["completion_len_mean"] = statistics.mean(r["completion_len_mean"] for r in runs)
    result["load_average_runs"] = [r["load_average"] for r in runs]
    # The floor of the aggregate: the runs' best GEMM rates (each run measured its own unless given), the median
    # token counts, and the median rollout over it.
    rates = {t: max(r[f"gemm_gflop_per_s_best{s}"] for r in runs) for t, s in ((args.threads, ""), (1, "_1thread"))}
    measured = {t: any(r["gemm_rate_measured"][str(t)] for r in runs) for t in rates}
    result.update(floor_fields(matmul_flop_per_token(runs[0]["shape"]),
                               statistics.median(r["rollout_prompt_tokens"] for r in runs),
                               statistics.median(r["rollout_sampled_tokens"] for r in runs),
                               result["rollout_s_median"], args.threads, rates, measured))
    result["repeat"] = args.repeat
    for key in ("step_s_all", "drawn_lengths_by_step", "mask_sums_by_step"):
        result.pop(key, None)
    return result


if __name__ == "__main__":
    sys.exit(main())  # --ops: bench_ops.main's exit status
