"""Tiny Qwen2 tokenizers built locally for the tool tests: one with Qwen2.5's `<tool_call>` / `</tool_call>` as
single added tokens (as in Qwen2.5's vocabulary), one without them (the markers are then several tokens)."""
import pytest

CORPUS = [
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 123*45?<|im_end|>\n"
    "<|im_start|>assistant\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"123*45\"}}\n"
    "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n5535\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\nThe answer is 5535.<|im_end|>",
    "print the result of the python code; error: unknown tool; output cut",
] * 8


@pytest.fixture(scope="session")
def tool_tokenizer(tmp_path_factory):
    from paddle_grpo.recipes.tiny import build_tokenizer

    return build_tokenizer(CORPUS, str(tmp_path_factory.mktemp("tool_tok")), vocab_size=400,
                           added_tokens=("<tool_call>", "</tool_call>"))


@pytest.fixture(scope="session")
def plain_tokenizer(tmp_path_factory):
    from paddle_grpo.recipes.tiny import build_tokenizer

    return build_tokenizer(CORPUS, str(tmp_path_factory.mktemp("plain_tok")), vocab_size=400)
