"""The data files, read as the trainer reads them, and the prompts' token counts against max_prompt_len."""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..config import Config, relative_path_note
from .keys import keyed


MAX_LENGTH_CHECKS = 20000  # prompts tokenized per data key (about a minute); beyond, an even sample of this many


def data_files(cfg: Config) -> List[Tuple[str, str]]:
    """(key, path) of every data file a run reads: train_datasets, and eval_datasets when do_eval."""
    keys = ["train_datasets"] + (["eval_datasets"] if cfg.do_eval and cfg.eval_datasets.strip() else [])
    return [(key, path.strip()) for key in keys for path in getattr(cfg, key).split(",") if path.strip()]


def check_data(cfg: Config, records: Optional[Dict[Tuple[str, str], list]] = None) -> List[str]:
    """Problems with the training (and, with do_eval, evaluation) files, each naming key, file and line. The records
    read are put in `records` ((key, path) -> records), for the prompt-length check."""
    from ..data import DataError, read_jsonl

    problems = []
    for key in ["train_datasets"] + (["eval_datasets"] if cfg.do_eval and cfg.eval_datasets else []):
        if not getattr(cfg, key).replace(",", "").strip():
            problems.append(f"{key}: is empty; name the JSONL/parquet file(s) to read")
    for key, path in data_files(cfg):
        if not os.path.isfile(path):
            problems.append(f"{key}: {path}: file not found{relative_path_note(cfg, path)}")
            continue
        try:
            rows = read_jsonl(path, prompt_key=cfg.prompt_key, response_key=cfg.response_key)
        except (DataError, OSError) as e:
            problems.append(keyed(key, str(e)))
            continue
        print(f"  {key}: {len(rows)} records ({path})")
        if records is not None:
            records[(key, path)] = rows
    return problems


def _record_places(path: str) -> List[str]:
    """'file:line' (JSONL; blank lines are skipped, as read_jsonl skips them) or 'file: row N' (parquet) of each
    record of a data file, in read_jsonl's order."""
    if path.endswith(".parquet"):
        import pandas as pd

        return [f"{path}: row {i}" for i in range(1, len(pd.read_parquet(path)) + 1)]
    with open(path, "rb") as f:
        return [f"{path}:{n}" for n, raw in enumerate(f, start=1) if raw.decode("utf-8", "replace").strip()]


def prompt_renderer(cfg: Config, tokenizer: Any) -> Optional[Callable[[str], str]]:
    """With `tools` (and a chat template), the prompt text the trainer builds for a record's `src`: the tools' schemas
    listed (step.PromptEncoder.text: the format's `prompt_with_tools`), which can make a prompt hundreds of tokens
    longer; None without tools, or when the tools or the format do not load (check_tools reports why)."""
    if not cfg.tools or cfg.chat_template == "none":
        return None
    from ..environment import RemoteToolSet, get_format, load_tools

    server = cfg.tool_server.strip()
    try:
        toolset = RemoteToolSet(server, cfg.tool_server_token, timeout_s=5, retries=0, names=cfg.tools) if server \
            else load_tools(cfg.tools)
        fmt = get_format(cfg.tool_format, tokenizer)
    except Exception:  # noqa: BLE001 - check_tools names the problem
        return None
    schemas = toolset.schemas()
    return lambda src: fmt.prompt_with_tools(src, tokenizer, schemas, None, mode=cfg.chat_template)


def check_prompt_lengths(cfg: Config, tokenizer: Any, config: Any, records: Dict[Tuple[str, str], list]
                         ) -> List[str]:
    """Warnings for prompts longer than max_prompt_len: the trainer keeps only their last max_prompt_len tokens
    (data.collate_prompts; the start, usually the instructions, is lost). Each prompt is encoded as the trainer
    encodes it (chat template, tokenizer, an encoder-decoder's special tokens); one line per key with how many of
    how many, the longest and the file and line of the longest. With tools, the prompts list them (`prompt_renderer`).

    A warning, not a problem: the launch can start and trains (PaddleNLP truncates the same way), a few long
    outliers may be truncated on purpose, and the exit status says only whether the launch can start."""
    from ..data import apply_chat_template, tokenize_prompts

    wrap = None
    if getattr(config, "is_encoder_decoder", False):
        from ..policy.seq2seq import encoder_input_ids

        wrap = encoder_input_ids
    render = prompt_renderer(cfg, tokenizer) or (lambda src: apply_chat_template(src, tokenizer,
                                                                                 mode=cfg.chat_template))
    per_key: Dict[str, list] = {}
    total = {key: sum(len(rows) for (k, _), rows in records.items() if k == key) for key, _ in records}
    # PaddleNLP's python tokenizers take 1-4 ms per prompt here: beyond MAX_LENGTH_CHECKS, an even sample
    stride = {key: -(-n // MAX_LENGTH_CHECKS) for key, n in total.items()}
    for (key, path), rows in records.items():
        picked = range(0, len(rows), stride[key])
        texts = [render(rows[i]["src"]) for i in picked]
        lengths = [len(wrap(tokenizer, ids) if wrap else ids) for ids in tokenize_prompts(tokenizer, texts)]
        per_key.setdefault(key, []).extend((n, path, i) for i, n in zip(picked, lengths))
    warnings = []
    for key, rows in per_key.items():
        longest, path, index = max(rows)
        over = sum(n > cfg.max_prompt_len for n, _, _ in rows)
        sample = "" if stride[key] == 1 else f" (a sample: 1 in {stride[key]} of {total[key]})"
        if not over:
            print(f"  {key}: prompts of {min(n for n, _, _ in rows)}-{longest} tokens, none longer than "
                  f"max_prompt_len ({cfg.max_prompt_len}){sample}")
            continue
        place = _record_places(path)[index]
        warnings.append(f"{key}: {over} of {len(rows)} prompts{sample} are longer than max_prompt_len "
                        f"({cfg.max_prompt_len}) "
                        f"and would be left-truncated (their first tokens dropped); the longest has {longest} tokens "
                        f"({place}). To keep them whole: max_prompt_len {longest} (and max_length at least "
                        f"{longest} + max_dec_len = {longest + cfg.max_dec_len})")
    return warnings
