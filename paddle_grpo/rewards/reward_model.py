"""A reward function backed by a sequence-scoring model (PaddleNLP's `AutoModelForSequenceClassification`, one label,
e.g. `Qwen2ForSequenceClassification`): the score of a sample is the model's output for prompt + completion.

    fn = RewardModel("path/to/rm", batch_size=8).load()
    fn(["<prompt>"], ["<completion>"])          # -> Scores([0.73])

The text scored is the prompt exactly as the trainer gives it to reward functions (the record's `src`, which may
already be chat-templated) followed by the completion text, tokenised with the reward model's own tokenizer.
A model judges every sample, so the result is a float per sample; a non-finite output or a text longer than the
model's positions is that sample's failure, with the reason (`Scores.errors`). paddle and PaddleNLP are imported in
`load()`, not at module import, so `import paddle_grpo.rewards` and the reward server stay light.
"""
import os
import threading
from typing import Any, List, Optional, Sequence

from .base import Completion, Scores, completion_text

# `reward_model:<dir or hub ID>` in reward_funcs / --reward names a reward model (registry.get_reward_fn).
REWARD_MODEL_PREFIX = "reward_model:"


class RewardModel:
    """`fn(prompts, completions, **kwargs) -> Scores` scoring each prompt + completion with a one-label model.

    name_or_path: a local model directory (config.json, weights, tokenizer) or a PaddleNLP hub ID (resolved by
        `from_pretrained`: its cache, or a download when online).
    batch_size: sequences per forward pass (`per_device_reward_batch_size`); the scores do not depend on it.
    max_score: the best score the model can give, when known (None: unknown, so no accuracy metric is derived).
    dtype: the dtype the weights are loaded in.

    Thread-safe: the reward server calls it from several threads; forward passes run one at a time.
    """

    reward_name = "reward_model"  # RewardSet's name for it (metrics, /health), instead of the long spec

    def __init__(self, name_or_path: str, batch_size: int = 8, max_score: Optional[float] = None,
                 dtype: str = "float32") -> None:
        if not isinstance(name_or_path, str) or not name_or_path.strip():
            raise ValueError(f"a reward model is given by a directory or hub ID, got {name_or_path!r}")
        if int(batch_size) < 1:
            raise ValueError(f"reward model batch size must be >= 1, got {batch_size}")
        self.name_or_path = name_or_path.strip()
        self.batch_size = int(batch_size)
        self.max_score = None if max_score is None else float(max_score)
        self.dtype = dtype
        self.__name__ = self.reward_name
        self.model = self.tokenizer = None
        self._lock = threading.Lock()

    def load(self) -> "RewardModel":
        """Load the model and tokenizer (once); errors name the model and what is wrong with it. Returns self."""
        with self._lock:
            if self.model is None:
                self._load()
        return self

    def _load(self):
        from paddlenlp.transformers import AutoModelForSequenceClassification, AutoTokenizer

        where = f"reward model {self.name_or_path!r}"
        local = os.path.isdir(self.name_or_path)
        if not local and self.name_or_path.startswith(("/", "./", "../", "~")):  # a path, never a hub ID
            raise FileNotFoundError(f"{where}: directory {os.path.abspath(self.name_or_path)} does not exist")
        try:
            model = AutoModelForSequenceClassification.from_pretrained(self.name_or_path, dtype=self.dtype)
            tokenizer = AutoTokenizer.from_pretrained(self.name_or_path)
        except Exception as exc:  # PaddleNLP raises many kinds; the user needs the model's name and the cause
            what = "the directory" if local else "it is not a local directory, and as a hub ID it"
            raise OSError(f"{where}: {what} could not be loaded with AutoModelForSequenceClassification / "
                          f"AutoTokenizer: {type(exc).__name__}: {str(exc)[:500]}") from exc
        if model.config.num_labels != 1:
            raise ValueError(f"{where}: a reward model has one output (num_labels 1), this one has "
                             f"{model.config.num_labels} ({type(model).__name__})")
        if model.config.pad_token_id is None:
            # The head pools at the position before the first pad token (see _forward); it needs a pad id.
            if tokenizer.pad_token_id is None:
                raise ValueError(f"{where}: neither its config nor its tokenizer defines a pad token")
            model.config.pad_token_id = tokenizer.pad_token_id
        model.eval()
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        self.model, self.tokenizer = model, tokenizer

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Completion], **kwargs: Any) -> Scores:
        """One score per sample; kwargs (tgt, other columns, completion_ids) are ignored: the model sees text only."""
        self.load()
        n = len(completions)
        if len(prompts) != n:
            raise ValueError(f"{len(prompts)} prompts but {n} completions")
        values: List[Optional[float]] = [None] * n
        errors: List[Optional[str]] = [None] * n
        ids = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions)):
            if not isinstance(prompt, str):
                raise TypeError(f"reward model: prompt {i} is a {type(prompt).__name__}; it scores text prompts "
                                "(the record's src)")
            tokens = self.tokenizer(prompt + completion_text(completion))["input_ids"]
            if self.max_positions and len(tokens) > self.max_positions:
                errors[i] = (f"prompt + completion is {len(tokens)} tokens, more than the reward model's "
                             f"max_position_embeddings ({self.max_positions})")
            elif not tokens:
                errors[i] = "prompt + completion is empty"
            ids.append(tokens)
        todo = sorted((i for i in range(n) if errors[i] is None), key=lambda i: len(ids[i]))
        # Similar lengths share a batch (less padding); each score goes back to its sample's position.
        for start in range(0, len(todo), self.batch_size):
            chunk = todo[start:start + self.batch_size]
            with self._lock:
                scores = self._forward([ids[i] for i in chunk])
            for i, value in zip(chunk, scores):
                if value != value or value in (float("inf"), float("-inf")):
                    errors[i] = f"the reward model returned {value}"
                else:
                    values[i] = value
        return Scores(values, errors)

    def _forward(self, rows: List[List[int]]) -> List[float]:
        """Scores of token-id rows: [b] floats from one forward pass.

        Rows are left-padded with at least one pad token. PaddleNLP's sequence-classification heads pool at the
        position before the *first* pad token, modulo the length: with a pad at position 0 that is the last
        position, i.e. every row's last real token, even when a text contains the pad token itself (where a
        right-padded or unpadded row would be pooled early). The pads are masked and the position ids count real
        tokens only, so a row's score does not depend on the batch it is in.
        """
        import numpy as np
        import paddle

        width = max(len(r) for r in rows) + 1
        pad = self.model.config.pad_token_id
        input_ids = np.full((len(rows), width), pad, dtype="int64")
        mask = np.zeros((len(rows), width), dtype="int64")
        for j, row in enumerate(rows):
            input_ids[j, width - len(row):] = row
            mask[j, width - len(row):] = 1
        positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
        with paddle.no_grad():
            out = self.model(paddle.to_tensor(input_ids), attention_mask=paddle.to_tensor(mask),
                             position_ids=paddle.to_tensor(positions), return_dict=True)
        logits = out.logits.astype("float32").numpy().reshape(len(rows), -1)  # [b, 1]
        return [float(v) for v in logits[:, 0]]
