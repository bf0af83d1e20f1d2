"""paddle_grpo: GRPO / REINFORCE++ reinforcement learning for PaddlePaddle / PaddleNLP language models.

Layout: `algorithms/` pure math, `config.py` configuration, `rewards/` reward functions and the reward-server
client, `data.py` datasets, `distributed.py` everything that touches paddle.distributed.
"""

__version__ = "0.1.0"
