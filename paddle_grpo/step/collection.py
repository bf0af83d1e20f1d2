"""The collect phase: prompts encoded, completions sampled (`rollout`) and scored (`score`), with DAPO dynamic
sampling (`collect`). With tools (`build_tools`) the prompts list them and the rollouts are multi-turn
(docs/tools.md): the rewards score the final assistant turn and also get the row's turns."""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..config import ConfigError, encoder_decoder_refusal
from ..data import PromptSampler, apply_chat_template, collate_prompts, tokenize_prompts
from ..parallel import ParallelContext
from ..policy import Policy
from ..rewards import RewardResult
from ..rewards.client import make_rewarder
from ..rollout import Rollout
from ..rollout.sampling import row_keys
from .batch import Batch, attention_mask, model_precision
from .metrics import CollectMetrics, ToolMetrics


def build_tools(cfg: Any, tokenizer: Any, policy: Optional[Policy] = None,
                par: Optional[ParallelContext] = None) -> Optional[Any]:
    """The run's `environment.ToolEnvironment` (tools loaded in-process, or served by `tool_server`; the format of
    `tool_format` for `tokenizer`; a pool of `tool_max_workers`), or None without `tools` (single-turn); under
    tensor parallelism wrapped by `par.tools_for_rollout` (one rank of each group runs the calls). The caller
    closes it when the run ends. An encoder-decoder `policy` is refused."""
    if not cfg.tools:
        return None
    if policy is not None and policy.is_encoder_decoder:
        raise NotImplementedError(encoder_decoder_refusal(cfg, True))
    from ..environment import ToolEnvironment, get_format, load_tools, sandbox
    where = f"tool_server {cfg.tool_server.strip()!r}: " if cfg.tool_server.strip() else ""
    if not where:
        try:
            sandbox.set_isolation(cfg.tool_sandbox)  # "namespaces" demanded and not to be had: refused now
        except sandbox.SandboxUnavailable as e:
            raise ConfigError(f"key 'tool_sandbox' ({cfg.tool_sandbox!r}): {e}") from None
    try:
        # A tool server that is down waits like a reward server (reward_server_max_wait_s), then stops the run.
        toolset = load_tools(cfg.tools, server=cfg.tool_server.strip(), token=cfg.tool_server_token,
                             timeout_s=cfg.tool_timeout_s, retries=-1, max_wait_s=cfg.reward_server_max_wait_s,
                             max_unanswered=cfg.tool_server_max_unanswered)
    except Exception as e:  # noqa: BLE001 - a user's module may raise anything: said with the key, cause chained
        raise ConfigError(f"key 'tools' ({', '.join(cfg.tools)}): {where}{_text(e)}") from e
    try:
        fmt = get_format(cfg.tool_format, tokenizer)
    except ValueError as e:
        raise ConfigError(f"key 'tool_format' ({cfg.tool_format!r}): {e}") from e
    env = ToolEnvironment(toolset, fmt, tokenizer, timeout_s=cfg.tool_timeout_s, max_workers=cfg.tool_max_workers,
                          max_response_tokens=cfg.max_tool_response_len)
    return env if par is None else par.tools_for_rollout(env)


def build_rewarder(cfg: Any) -> Any:
    """The run's rewarder: the reward server's client (`use_rm_server`) or the in-process reward functions / model
    (rewards.client.make_rewarder with the config's keys)."""
    server = dict(reward_server=cfg.reward_server, token=cfg.reward_server_token or None,
                  read_timeout=cfg.reward_server_timeout, max_retries=cfg.reward_server_max_retries,
                  max_wait_s=cfg.reward_server_max_wait_s)
    return make_rewarder(cfg.use_rm_server, reward_funcs=cfg.reward_funcs, reward_weights=cfg.reward_weights,
                         timeout_s=cfg.reward_timeout_s or None, **(server if cfg.use_rm_server else {}),
                         reward_model_name_or_path=cfg.reward_model_name_or_path,
                         reward_batch_size=cfg.per_device_reward_batch_size)


def _text(error: BaseException) -> str:
    """An exception's message (a KeyError's without the quotes its str() adds)."""
    return str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)


class PromptEncoder:
    """Left-padded prompt ids [B, L] and mask for dataset rows, tokenised once per row. With `tools` (a
    ToolEnvironment) a raw prompt is rendered with the tools listed (its format's `prompt_with_tools`; chat_template
    none leaves it as is, and an already templated prompt stays unchanged), and a special token's string inside the
    tools' schemas is tokenized as its characters (`prompt_with_tools_parts`, executor.tool_turn_ids)."""

    def __init__(self, policy: Policy, tokenizer: Any, chat_template: str, max_prompt_len: int,
                 tools: Optional[Any] = None):
        self.policy, self.tokenizer = policy, tokenizer
        self.chat_template, self.max_prompt_len = chat_template, max_prompt_len
        self.tools = tools
        self._cache: Dict[Tuple[int, int], List[int]] = {}

    def text(self, prompt: str) -> str:
        """The text the policy sees for a record's prompt."""
        if self.tools is not None and self.chat_template != "none":
            return "".join(text for text, _ in self.parts(prompt))
        return apply_chat_template(prompt, self.tokenizer, mode=self.chat_template)

    def parts(self, prompt: str) -> List[Tuple[str, bool]]:
        """A prompt with tools as the format's (text, is_content) pieces; the schemas' special-token strings are
        content (plain text)."""
        return self.tools.fmt.prompt_with_tools_parts(prompt, self.tokenizer, self.tools.tools.schemas(), None,
                                                      mode=self.chat_template)

    def ids(self, prompt: str) -> List[int]:
        """The token ids of `text(prompt)` (before policy.prompt_token_ids): as data.tokenize_prompts, except that
        a special token's string in a tool's schema is its characters (a tool server's text cannot write one)."""
        if self.tools is not None and self.chat_template != "none":
            from ..environment.executor import tool_turn_ids
            return tool_turn_ids(self.tokenizer, self.parts(prompt))
        return tokenize_prompts(self.tokenizer, [self.text(prompt)])[0]

    def __call__(self, records: Sequence[dict], indices: Sequence[int]) -> Tuple[np.ndarray, np.ndarray]:
        token_lists = []
        for i in indices:
            key = (id(records), i)
            if key not in self._cache:
                self._cache[key] = self.policy.prompt_token_ids(self.tokenizer, self.ids(records[i]["src"]))
            token_lists.append(self._cache[key])
        ids, mask = collate_prompts(token_lists, self.tokenizer.pad_token_id, self.max_prompt_len)
        return ids, mask



def rollout(policy: Policy, encode: PromptEncoder, cfg: Any, records: Sequence[dict], indices: Sequence[int],
            G: int, *, do_sample: bool = True, keys: Optional[np.ndarray] = None, amp: Any = None,
            precision: str = "float32", sampling: Optional[Dict[str, Any]] = None) -> Rollout:
    """G completions for each of the dataset rows `indices` (rollout.generate's contract); the model under
    `model_precision(amp)` (the sampling maths stay float32: rollout.decode), its CPU decode products in
    `precision` (rollout_precision: the training rollouts; evaluation keeps float32). With the encoder's tools:
    multi-turn, up to `max_turns` assistant turns (the Rollout's `tool_mask` and `turns` set). `sampling`:
    temperature / top_p / top_k / max_new_tokens in place of the config's (the evaluation's own,
    Config.eval_generation)."""
    prompt_ids, prompt_mask = encode(records, indices)
    tokenizer = encode.tokenizer
    multi_turn = {} if encode.tools is None else {"tools": encode.tools, "max_turns": cfg.max_turns,
                                                  "tool_sync": getattr(encode.tools, "sync", None)}  # TP: GroupTools
    settings = {"temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": cfg.top_k,
                "max_new_tokens": cfg.max_dec_len, **(sampling or {})}
    with model_precision(amp):
        return policy.generate(prompt_ids, prompt_mask, num_samples=G,
                               min_new_tokens=min(cfg.min_dec_len, settings["max_new_tokens"]),
                               eos_token_ids=sorted({tokenizer.eos_token_id}), pad_token_id=tokenizer.pad_token_id,
                               repetition_penalty=cfg.repetition_penalty, do_sample=do_sample,
                               max_num_seqs=cfg.rollout_max_num_seqs, row_keys=keys, **settings, **multi_turn,
                               **({} if precision == "float32" else {"rollout_precision": precision}))


def final_answer(turns: List[dict]) -> str:
    """The content of the last assistant turn of a row's messages ("" when it has none)."""
    return next((m.get("content") or "" for m in reversed(turns) if m.get("role") == "assistant"), "")


def completion_texts(tokenizer: Any, rollout: Rollout) -> List[str]:
    """Completion texts without the EOS token (what reward functions and the server see); multi-turn
    (`rollout.turns` set): each row's final assistant turn's content, the answer (`final_answer`)."""
    turns = rollout.turns
    if turns is not None:
        return [final_answer(t) for t in turns]
    ids = rollout.completion_ids.numpy()
    texts = []
    for row, n, cut in zip(ids, rollout.lengths, rollout.truncated):
        keep = row[:n] if cut else row[:max(0, n - 1)]
        # clean_up_tokenization_spaces would rewrite the text (" ..." -> "..."); rewards see it verbatim.
        texts.append(tokenizer.decode(keep.tolist(), skip_special_tokens=False, clean_up_tokenization_spaces=False))
    return texts


def completion_extent(rollout: Rollout) -> np.ndarray:
    """[N, T] the completion tokens that exist, actions and tool output (numpy)."""
    return attention_mask(rollout.completion_mask, rollout.tool_mask).numpy()


def score(par: ParallelContext, rewarder: Any, use_rm_server: bool, records: Sequence[dict],
          indices: Sequence[int], rollout: Rollout, texts: List[str], G: int) -> RewardResult:
    """Rewards of this rank's rows; under tensor or pipeline parallelism one request per group, shared. Multi-turn
    rows also pass `turns` (each row's messages: assistant turns with their tool calls, tool results), in-process
    as a keyword argument and to the reward server as the request's `turns` field; `completion_ids` are then the
    whole completion's tokens, actions and tool output."""
    turns = rollout.turns

    def request():
        rows = [records[i] for i in indices for _ in range(G)]
        srcs = [r["src"] for r in rows]
        if use_rm_server:  # the server protocol carries src, tgt, the response (and turns) only
            with_turns = {} if turns is None else {"turns": turns}
            return rewarder.score_detailed(srcs, [r.get("tgt") or "" for r in rows], texts, **with_turns)
        extra = {k: [r.get(k) for r in rows] for k in rows[0] if k not in ("src", "tgt")} if rows else {}
        ids = rollout.completion_ids.numpy()
        # Multi-turn: the union of actions and tool output is contiguous from column 0 (rollout/'s contract).
        ends = rollout.lengths if turns is None else completion_extent(rollout).sum(1)
        extra["completion_ids"] = [ids[j, :ends[j]].tolist() for j in range(len(rows))]
        if turns is not None:
            extra["turns"] = turns
        return rewarder.score_detailed(srcs, [r.get("tgt") for r in rows], texts, **extra)

    return par.share_within_model_parallel_group(request)


def collect(par: ParallelContext, policy: Policy, encode: PromptEncoder, rewarder: Any, sampler: PromptSampler,
            records: Sequence[dict], cfg: Any, prompts_per_rank: int, step: int,
            amp: Any = None) -> Tuple[Batch, CollectMetrics]:
    """Sample and score this rank's share of the step's prompts; with DAPO dynamic sampling, more rounds until every
    rank has `prompts_per_rank` groups with reward variance (or `max_gen_batches` rounds). Sampling noise is keyed
    by (seed, step, round, global row): the same samples on 1 or N ranks. `amp`: see `model_precision`."""
    G = cfg.rollout_n
    metrics = CollectMetrics()
    tool_wait_s = 0.0
    kept: List[Tuple[Batch, int]] = []   # (round batch, group) in the order the step keeps them
    dropped = rounds = 0
    while True:
        rounds += 1
        global_indices = sampler.next_batch()
        positions = par.prompt_positions(len(global_indices), cfg.mini_batch_prompts)
        mine = [global_indices[p] for p in positions]
        rows = (np.asarray(positions)[:, None] * G + np.arange(G)[None, :]).reshape(-1)
        t0 = time.perf_counter()
        sampled = rollout(policy, encode, cfg, records, mine, G, keys=row_keys(cfg.seed, step * 1000 + rounds, rows),
                          amp=amp, precision=cfg.rollout_precision)
        t1 = time.perf_counter()
        tool_wait_s += sampled.tool_wait_s or 0.0
        texts = completion_texts(encode.tokenizer, sampled)
        batch = Batch.from_rollout(sampled, texts, score(par, rewarder, cfg.use_rm_server, records, mine, sampled,
                                                         texts, G), mine, G)
        metrics.reward_s += time.perf_counter() - t1
        metrics.rollout_s += t1 - t0
        if not cfg.dynamic_sampling:
            kept = [(batch, g) for g in range(len(mine))]
            break
        informative = batch.informative_groups(G)
        dropped += int((~informative).sum())
        kept.extend((batch, int(g)) for g in np.flatnonzero(informative))
        enough = min(par.all_gather_object(len(kept))) >= prompts_per_rank  # every rank must agree to go on
        if enough or rounds >= cfg.max_gen_batches:
            if not enough:  # fill with the zero-variance groups of the last round (their advantage is 0)
                kept.extend((batch, int(g)) for g in np.flatnonzero(~informative))
            break
    kept = kept[:prompts_per_rank]
    if cfg.dynamic_sampling:
        metrics.dropped_groups = float(sum(par.all_gather_object(dropped)))
        metrics.rounds = float(rounds)
    runs: List[Tuple[Batch, List[int]]] = []   # consecutive groups of one round, selected together
    for source, g in kept:
        if runs and runs[-1][0] is source:
            runs[-1][1].append(g)
        else:
            runs.append((source, [g]))
    parts = [source if groups == list(range(len(source) // G)) else source.groups(groups, G)
             for source, groups in runs]
    batch = Batch.concat(parts, encode.tokenizer.pad_token_id)
    if encode.tools is not None:
        metrics.tools = ToolMetrics.of(par, batch, tool_wait_s)
    return batch, metrics
