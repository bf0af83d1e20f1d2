"""Shared by the reward-model tests (tests/rewards/test_reward_model.py, tests/reward_server/): sample texts and
the independent reference.

The reference tokenises each prompt + completion alone (no padding, no batch) and takes the model's per-token score
at the last token: the backbone's hidden states through the `score` head, not the model's own pooled forward (which
pools before the first pad token, and so early when a text contains the pad token, as COMPLETIONS[2] does).
"""
import paddle
from numerics import f32_sum_tol

# Two float32 evaluations of the tiny reward model's score (recipes/tiny.py build_reward_model: 2 layers, hidden 32,
# intermediate 64) by other kernels (a padded batch against one text alone, another CPU): about 20 chained sums (per
# layer RMSNorm, q/k/v, scores, softmax, values, o, RMSNorm, gate/up, down; then the final norm and the score head) of
# at most 64 terms adding up to at most ~1 (the scores are ~0.2). Absolute.
REWARD_MODEL_TOL = f32_sum_tol(64, 1.0, depth=20)  # 1.5e-4

PROMPTS = ["<|im_start|>user\nWhat is 12 + 35?<|im_end|>\n<|im_start|>assistant\n", "Who is Zoey? ", "", "x"]
COMPLETIONS = ["The answer is 47. #### 47", "Zoey is a knight", "a knave <|endoftext|> said so", "#### 9"]


def reference_scores(model_dir, prompts, completions):
    """[n] floats: the model's last-token score of each prompt + completion, computed one text at a time."""
    from paddlenlp.transformers import AutoTokenizer, Qwen2ForSequenceClassification

    model = Qwen2ForSequenceClassification.from_pretrained(model_dir)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    out = []
    with paddle.no_grad():
        for prompt, completion in zip(prompts, completions):
            ids = paddle.to_tensor([tokenizer(prompt + completion)["input_ids"]])
            hidden = model.qwen2(ids, return_dict=True).last_hidden_state  # [1, T, H]
            out.append(float(model.score(hidden)[0, -1, 0]))            # [1, T, 1] -> the last token's
    return out
