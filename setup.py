"""Install paddle_grpo: `pip install -e ".[test]"`.

CPU users get the CPU build of PaddlePaddle from PyPI. GPU users install `paddlepaddle-gpu` 3.x from Paddle's own
package index *first*; this file then sees it in the target environment and does not add the CPU build beside it
(two paddle builds in one environment shadow each other's files).
"""
import glob
import os
import sys
import sysconfig

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def gpu_paddle_installed(prefix=sys.prefix):
    """True when a paddlepaddle-gpu distribution is installed in the environment rooted at `prefix`.

    Looked up on disk rather than with importlib.metadata because pip runs this file in an isolated build
    environment whose sys.path hides the target environment's packages; sys.prefix still points at it.
    """
    purelib = sysconfig.get_paths(vars={"base": prefix, "platbase": prefix})["purelib"]
    return bool(glob.glob(os.path.join(purelib, "paddlepaddle_gpu-*.dist-info")))


PADDLE = [] if gpu_paddle_installed() or os.environ.get("PADDLE_GRPO_SKIP_PADDLE") == "1" else [
    # 3.x: the paddle.distributed/fleet APIs and the CPU kernels this project relies on (tested with 3.3.1).
    "paddlepaddle>=3.0,<3.4",
]

INSTALL_REQUIRES = PADDLE + [
    # The newest PaddleNLP; a pre-release, so it must be pinned exactly for pip to pick it (2.8.1 predates paddle 3).
    "paddlenlp==3.0.0b4",
    # aistudio-sdk >= 0.3 removed `aistudio_sdk.hub.download`, which `import paddlenlp` 3.0.0b4 needs.
    "aistudio-sdk<0.3",
    # paddlenlp 3.0.0b4 pins numpy<=1.26.4; pyarrow 26 (pulled in by `datasets`) refuses numpy 1.x at import.
    "numpy<=1.26.4",
    "pyarrow>=21,<26",
    # No pin keeps `visualdl --logdir DIR` from answering HTTP 500 to curl and to browsers in languages other than
    # English and Chinese: every VisualDL from 2.0.5 to 2.5.3 sets its language cookie to None then, which every
    # Werkzeug (2.2 to 3.1) refuses. The README's command passes `--language en` (paddle_grpo/logging.py).
    "visualdl>=2.5",
    "flask>=3.0",
    "waitress>=3.0",
    "requests>=2.31",
    "pyyaml>=6.0",
    "tqdm>=4.66",
    # Trains the byte-level BPE of the locally built tiny models (paddlenlp depends on it too).
    "tokenizers>=0.19",
    "math-verify>=0.7",
    "rouge-score>=0.1.2",
    "matplotlib>=3.7",
]

# `.[peer]`: the PyTorch side of tools/bench/trl_bench.py (TRL's GRPOTrainer; docs/PERFORMANCE.md), the versions its
# comparison was measured with. It needs its own virtual environment, installed with PADDLE_GRPO_PEER_ONLY=1:
# TRL 1.16 needs transformers >= 4.56, which needs tokenizers >= 0.22, while paddlenlp 3.0.0b4 needs tokenizers < 0.22,
# so the two cannot share an environment; PADDLE_GRPO_PEER_ONLY=1 leaves this project's runtime requirements out (the
# harness imports only recipes/tiny.py's tokenizer writer, which needs none of them). torch is pinned exactly: an
# unpinned torch on Linux resolves to the multi-GB CUDA build, while the comparison runs the CPU build of 2.13.0
# (install that first from PyTorch's CPU wheel index where it is not already at hand; pip then keeps it).
PEER = ["torch==2.13.0", "trl==1.16.0"]

# `.[gguf]`: tools/models/import_gguf.py (a llama.cpp GGUF file -> a PaddleNLP model directory; docs/models.md).
# `gguf` is llama.cpp's own reader and numpy dequantizer (it needs only numpy, pyyaml, requests, tqdm; no torch).
# Pinned to the version the importer was verified with: its reader API (ReaderField.contents) and quantization tables changed
# between releases, and the importer's results are compared bit for bit with this version's.
GGUF = ["gguf==0.19.0"]
# `.[llamacpp]`: tools/bench/llamacpp_generation.py, llama.cpp's side of the generation comparison (docs/PERFORMANCE.md,
# "Generation"). llama-cpp-python ships llama.cpp as source: pip compiles it (cmake and a C++ compiler, about 8 minutes
# on 2 cores), so it goes into its own environment, installed with PADDLE_GRPO_PEER_ONLY=1 (the tool needs neither
# paddle nor torch). Pinned to the version the tool's low-level calls (llama_batch, per-sequence KV streams,
# llama_memory_seq_cp) were written against: those C bindings change between releases. gguf reads the file's weight
# types and writes the tool's float32 copy.
LLAMACPP = ["llama-cpp-python==0.3.36"] + GGUF
# The tests include the importer's (tiny GGUF files written by gguf's own writer; no download), so `.[test]` has it.
# pytest-xdist: pytest.ini runs the suite on two worker processes (`-n 2`).
TEST = ["pytest>=7.4", "pytest-xdist>=3.5"] + GGUF


def requirements(environ=os.environ):
    """install_requires: INSTALL_REQUIRES, or nothing for the peer's own environment (PADDLE_GRPO_PEER_ONLY=1)."""
    return [] if environ.get("PADDLE_GRPO_PEER_ONLY") == "1" else INSTALL_REQUIRES


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import it for gpu_paddle_installed
    setup(
        name="paddle_grpo",
        version="0.1.0",
        description="Reinforcement learning (GRPO, REINFORCE++, RLOO, PPO, VAPO; multi-turn with tools) for "
                    "PaddlePaddle / PaddleNLP language models",
        long_description=open(os.path.join(HERE, "README.md"), encoding="utf-8").read(),
        long_description_content_type="text/markdown",
        # PaddleNLP 3.0.0b4 and our pins are used on 3.9-3.11; CI and every measurement in the docs use 3.11.
        # 3.12 is excluded until it is tested: PaddleNLP 3.0.0b4 predates it.
        python_requires=">=3.9,<3.12",
        packages=find_packages(include=["paddle_grpo", "paddle_grpo.*", "reward_server", "reward_server.*"]),
        py_modules=["run_rl"],
        install_requires=requirements(),
        extras_require={"test": TEST, "peer": PEER, "gguf": GGUF, "llamacpp": LLAMACPP},
        entry_points={"console_scripts": ["paddle-grpo-reward-server=reward_server.__main__:main"]},
        license="Apache-2.0",
    )
