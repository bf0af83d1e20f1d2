"""paddle_grpo: GRPO / REINFORCE++ reinforcement learning for PaddlePaddle / PaddleNLP language models.

Layout: `algorithms/` pure math, `config.py` configuration, `rewards/` reward functions and the reward-server
client, `data.py` datasets, `distributed.py` everything that touches paddle.distributed.
"""

import warnings

__version__ = "0.1.0"

# Known-harmless warnings of third-party packages, silenced here, before any of them is imported, so that a run's
# first lines are its own. Each names its package and why it does not concern this project.
# paddle.utils.cpp_extension (imported by paddle itself) warns that ccache is missing: it concerns compiling
# custom ops, which this project has none of.
warnings.filterwarnings("ignore", message="No ccache found")
# setuptools' distutils shim, triggered when PaddleNLP's dependencies import distutils.
warnings.filterwarnings("ignore", message="Setuptools is replacing distutils")
# PaddleNLP 3.0.0b4's Qwen2 MLP calls paddle.incubate's swiglu, deprecated in paddle 3.3 (same kernel); once per run.
warnings.filterwarnings("ignore", message=r"(?s).*paddle\.incubate\.nn\.functional\.swiglu")
