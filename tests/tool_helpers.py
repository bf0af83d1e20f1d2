"""Shared by the multi-turn tests (tests/test_tools_e2e.py, tests/parallel/test_tools_parallel.py): a tiny policy that
calls the calculator often, whatever it is asked, and the data and reward of its runs.

The policy's vocabulary has three extra tokens, each the whole text of a call: CALL (a well-formed calculator call of
12*34), BAD (a call cut off: malformed) and UNKNOWN (a call of a tool that does not exist). Its layers' outputs are
scaled down (o_proj, down_proj x 0.01) and every token embeds alike, so its next-token distribution hardly depends on
the context: P(CALL) ~ P_CALL, P(BAD) ~ P(UNKNOWN) ~ P_OTHER_CALL, P(EOS) ~ P_EOS, the rest spread over the
vocabulary. A turn is a handful of tokens ending at EOS; most turns hold a call, so tool turns certainly occur in a
batch of a few dozen samples (and the mix of well-formed, malformed and unknown calls exercises every error path),
while every weight still gets a gradient.
"""
import json
import os

import numpy as np

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*34"}}\n</tool_call>'
BAD = '<tool_call>\n{"name": "calculator", "arguments": {"expression": '
UNKNOWN = '<tool_call>\n{"name": "abacus", "arguments": {}}\n</tool_call>'
P_CALL, P_OTHER_CALL, P_EOS = 0.35, 0.05, 0.3
CORPUS = ["What is 12 * 34? Use the calculator. The answer is 408.", "Compute 7 + 5 = 12 and 3 * 4 = 12."] * 10


def build_tool_policy(out_dir, seed=0):
    """The policy of the module docstring in `out_dir` (tokenizer + Qwen2 weights, save_pretrained); returns the
    ids of CALL, BAD, UNKNOWN."""
    import paddle
    from paddlenlp.transformers import AutoTokenizer

    from paddle_grpo.recipes.tiny import _byte_to_unicode, build_model, build_tokenizer

    build_tokenizer(CORPUS, out_dir, vocab_size=300)
    # Each call text as ONE vocabulary entry, written byte-level as the BPE's entries are (decoding maps it back).
    to_unicode = _byte_to_unicode()
    path = os.path.join(out_dir, "vocab.json")
    with open(path, encoding="utf-8") as f:
        vocab = json.load(f)
    ids = []
    for text in (CALL, BAD, UNKNOWN):
        vocab["".join(to_unicode[b] for b in text.encode("utf-8"))] = len(vocab)
        ids.append(len(vocab) - 1)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    assert tokenizer.decode([ids[0]], skip_special_tokens=False) == CALL
    model = build_model(out_dir, tokenizer, seed=seed)
    V, eos = len(tokenizer), tokenizer.eos_token_id
    with paddle.no_grad():
        state = model.state_dict()
        for name, p in state.items():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.set_value(p * 0.01)
        embed = state["qwen2.embed_tokens.weight"]
        row = paddle.ones([embed.shape[1]]) * 0.5
        embed.set_value(paddle.tile(row[None], [V, 1]) + paddle.randn(embed.shape) * 0.01)
        # The final hidden state is then ~ RMSNorm(row) = u (norm weights 1): logits = u . head[:, v].
        u = np.ones(embed.shape[1], dtype="float32")
        rest = (1 - P_CALL - 2 * P_OTHER_CALL - P_EOS) / (V - 4)
        logit = lambda p: float(np.log(p / rest))  # noqa: E731 - the others at logit ~0
        head = np.random.default_rng(seed).standard_normal((embed.shape[1], V)).astype("float32") * 0.01
        for v, p in ((ids[0], P_CALL), (ids[1], P_OTHER_CALL), (ids[2], P_OTHER_CALL), (eos, P_EOS)):
            head[:, v] = u * logit(p) / float(u @ u)
        state["lm_head.weight"].set_value(paddle.to_tensor(head))
    model.save_pretrained(out_dir)
    return ids


def write_tool_data(directory, n=8):
    """train.jsonl / eval.jsonl of `n` arithmetic questions (raw prompts: the tools are listed by the format)."""
    rows = [{"src": f"What is 12 * {34 + i}? Use the calculator.", "tgt": str(12 * (34 + i))} for i in range(n)]
    for name in ("train", "eval"):
        with open(os.path.join(directory, f"{name}.jsonl"), "w", encoding="utf-8") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
    return os.path.join(directory, "train.jsonl"), os.path.join(directory, "eval.jsonl")


# The reward sees the trajectory: 1 when a calculator result in the turns is 408 (the policy's only well-formed call),
# plus a small length term on the final answer so that rewards vary within groups; max_score declared.
REWARD_FILE = '''
def used_calculator(prompts, completions, turns=None, **kwargs):
    assert turns is not None and len(turns) == len(completions), "the reward got no turns"
    return [float(any(m["role"] == "tool" and m["content"].strip() == "408" for m in t)) + 0.01 * min(len(c), 50)
            for t, c in zip(turns, completions)]

used_calculator.max_score = 1.5
'''
