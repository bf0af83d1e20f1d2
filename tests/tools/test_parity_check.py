"""tools/models/parity_check.py: the comparisons behind docs/models.md's parity figures, and the figures themselves.

Without the peer: the core comparison functions on the tiny local model (this project's two forward paths against
each other, the exporter's tokenizer.json read by the `tokenizers` library against this project's ids) and on
perturbed inputs that must fail. With the peer (PADDLE_GRPO_PEER_PYTHON): transformers on the tiny model's export,
through the script's own peer code. Always: docs/models.md's (and README's) figures are the results file's.
"""
import importlib.util
import json
import os
import pathlib
import re

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results" / "parity_smollm2.json"
STRINGS = ["Hello world", "<|im_start|>user\nWhat is 12 + 35?<|im_end|>\n", "  42\n\n\tx = 3.14159",
           "café naïve 日本語 😀 don't I'M", "Zoey says Ethan is a knave. #### 47", "<|endoftext|>a  b   c"]
IDS = [[5, 17, 42, 99, 3, 250, 7, 8, 11, 12], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 40, 41]]


@pytest.fixture(scope="module")
def parity():
    spec = importlib.util.spec_from_file_location("_parity_check", ROOT / "tools" / "models" / "parity_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ours(parity, tiny_policy_dir):
    return parity.our_side(tiny_policy_dir, IDS, STRINGS, greedy_prompts=2, greedy_steps=6)


def test_probe_strings_are_fixed_and_cover_special_tokens_digits_spaces_unicode(parity):
    strings = parity.probe_strings()
    assert strings == parity.probe_strings() and len(strings) == len(parity.PIECES) + 400 == 436
    for kind in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "  42", "\n\n", "日本語", "😀", "e\u0301"):
        assert kind in strings, kind


def test_the_run_path_agrees_with_paddlenlps_forward_on_the_tiny_model(parity, ours):
    """The run's log-probs (fast decoder path) against the log-softmax of PaddleNLP's full logits: within the
    script's tolerance; the same comparison fails once one logit row is moved by a tenth of the scale."""
    assert "fast path" in ours["decoder"]
    assert ours["layers"] == 2 and ours["n_terms"] == 128  # conftest's tiny Qwen2: hidden 64, intermediate 128
    got = parity.compare_logprobs(ours["run_logprobs"], ours["splits"], IDS, ours["logits"], ours["n_terms"],
                                  ours["layers"])
    assert got["passed"] and got["tokens"] == sum(len(r) - len(r) // 2 for r in IDS), got
    moved = [a.copy() for a in ours["logits"]]
    k = ours["splits"][0]
    moved[0][k - 1, IDS[0][k]] += 0.1 * np.abs(moved[0]).max()
    assert not parity.compare_logprobs(ours["run_logprobs"], ours["splits"], IDS, moved, ours["n_terms"],
                                       ours["layers"])["passed"]


def test_compare_logits_is_relative_to_the_scale_and_fails_beyond_rounding(parity, ours):
    logits = ours["logits"]
    same = parity.compare_logits(logits, logits, 128, 2)
    assert same["max_abs_diff"] == 0 and same["passed"] and same["scale"] == max(np.abs(a).max() for a in logits)
    # Rounding-sized differences (one float32 ulp on every logit: 2^-23 relative) pass ...
    rounded = [np.nextafter(a, np.float32(np.inf)) for a in logits]
    got = parity.compare_logits(logits, rounded, 128, 2)
    assert got["passed"] and 0 < got["relative"] <= 2.0 ** -23
    # ... a defect's size (one logit moved by 1 % of the scale) does not
    moved = [a.copy() for a in logits]
    moved[1][3, 7] += 0.01 * same["scale"]
    got = parity.compare_logits(logits, moved, 128, 2)
    assert not got["passed"] and got["relative"] == pytest.approx(0.01, rel=1e-4)
    # The tolerance rule of the results file: SmolLM2 (longest sum 1536, 30 layers) allows 1.3e-3 of the scale
    tol = parity.logit_tolerance(1.0, 1536, 30)
    assert tol["tolerance"] == pytest.approx(2 * 272 * 1536 ** 0.5 * 2.0 ** -24) and 1.2e-3 < tol["tolerance"] < 1.4e-3
    assert tol["worst_case"] == pytest.approx(2 * 272 * 1536 * 2.0 ** -24)


def test_compare_ids_counts_and_shows_the_differences(parity, ours):
    theirs = [list(r) for r in ours["ids"]]
    assert parity.compare_ids(ours["ids"], theirs, STRINGS) == {"strings": 6, "equal": 6, "differ": 0,
                                                                 "examples": []}
    theirs[2] = theirs[2][:-1]
    got = parity.compare_ids(ours["ids"], theirs, STRINGS)
    assert got["differ"] == 1 and got["examples"][0]["text"] == STRINGS[2]


def test_the_exporters_tokenizer_json_gives_our_ids(parity, ours, tiny_policy_dir, tmp_path):
    """The export (the exporter the script runs, found where tools/ keeps it) read by the `tokenizers` library
    itself: the same ids as this project's tokenizer on every string."""
    from tokenizers import Tokenizer

    summary = parity.export_fresh(parity.find_tool("export_hf"), tiny_policy_dir, str(tmp_path / "hf"))
    written = Tokenizer.from_file(os.path.join(summary["out"], "tokenizer.json"))
    theirs = [written.encode(s, add_special_tokens=False).ids for s in STRINGS]
    assert parity.compare_ids(ours["ids"], theirs, STRINGS)["differ"] == 0


def test_greedy_agreement_allows_only_a_tie(parity, ours, tiny_policy_dir):
    tokens, gaps = ours["greedy"][0]
    assert 1 <= len(tokens) <= 6 and len(gaps) == len(tokens)
    assert parity.compare_greedy(tokens, gaps, tokens, 1e-6)["passed"]
    other = list(tokens)
    other[0] = (other[0] + 1) % 320
    assert not parity.compare_greedy(tokens, gaps, other, tol=gaps[0] / 2)["passed"]  # not a tie: fails
    assert parity.compare_greedy(tokens, gaps, other, tol=gaps[0] * 2)["tie_at"] == 0  # a tie: allowed


# ----------------------------------------------------------------------------------------- transformers itself


def test_transformers_on_the_tiny_export_through_the_scripts_peer_code(parity, ours, tiny_policy_dir, tmp_path):
    python = os.environ.get("PADDLE_GRPO_PEER_PYTHON")
    if not python:
        pytest.skip("PADDLE_GRPO_PEER_PYTHON is not set: the transformers side needs the peer environment "
                    "(../shared/peer/make_peer_venv.sh .peer-venv; then PADDLE_GRPO_PEER_PYTHON=.peer-venv/bin/python)")
    summary = parity.export_fresh(parity.find_tool("export_hf"), tiny_policy_dir, str(tmp_path / "hf"))
    job = parity.peer_job("tiny", summary["out"], ours, IDS, STRINGS, [])
    theirs = parity.run_peer(python, [job], str(tmp_path / "work"), timeout=600)
    got = parity.compare_all(ours, theirs["tiny"], IDS, STRINGS)
    assert got["logits"]["passed"] and got["logits"]["positions"] == sum(map(len, IDS)), got["logits"]
    assert got["run_logprobs"]["passed"], got["run_logprobs"]
    assert got["greedy"]["passed"] and got["greedy"]["prompts"] == 2, got["greedy"]
    assert got["tokenizer"]["differ"] == 0, got["tokenizer"]


# --------------------------------------------------------------------------------------- the published figures


def e(x):
    """A figure as the docs write it: 1.5e-4 (not 1.5e-04)."""
    return re.sub(r"e([+-])0(\d)", r"e\1\2", format(x, ".1e"))


def test_the_docs_figures_are_the_results_files():
    """docs/models.md and README.md quote docs/results/parity_smollm2.json (written by the script): each figure as
    the docs round it, the command that reproduces it, and a results file whose every check passed."""
    results = json.loads(RESULTS.read_text(encoding="utf-8"))
    docs = " ".join((ROOT / "docs" / "models.md").read_text(encoding="utf-8").split())
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert results["passed"] and results["trained"] is not None
    imp, exp, trained = results["import"], results["export"], results["trained"]
    n = results["inputs"]["strings"]
    phrases = [
        results["command"], "results/parity_smollm2.json",
        f"{imp['logits']['positions']} positions",
        f"the logits agree to {e(imp['logits']['max_abs_diff'])} (largest logit {imp['logits']['scale']:.1f}: "
        f"{e(imp['logits']['relative'])} of it",
        f"the run's own log-probs (the fast decoder path) to {e(imp['run_logprobs']['max_abs_diff'])}",
        f"{exp['weights_vs_gguf']['equal']} of {exp['weights_vs_gguf']['tensors']} tensors",
        f"greedy tokens of {imp['greedy']['prompts']} prompts ({imp['greedy']['same_tokens']} tokens",
        f"SmolLM2's own text split on {imp['tokenizer_smollm_split']['equal']} strings",
        f"{imp['tokenizer']['differ']} of those {n} strings",
        f"agree with PaddleNLP's forward of the original to {e(exp['logits']['max_abs_diff'])} (largest logit "
        f"{exp['logits']['scale']:.1f}",
        f"its token ids equal PaddleNLP's on {exp['tokenizer']['equal']} strings",
        f"`{trained['checkpoint']}`",
        f"moved by up to {trained['logits_moved_from_base']:.1f}",
        f"agree with this project's to {e(trained['vs_transformers_on_export']['logits']['max_abs_diff'])} "
        f"(largest logit {trained['vs_transformers_on_export']['logits']['scale']:.1f}",
    ]
    for phrase in phrases:
        assert " ".join(phrase.split()) in docs, phrase
    assert imp["tokenizer_smollm_split"]["equal"] == exp["tokenizer"]["equal"] == n
    assert trained["vs_transformers_on_export"]["tokenizer"]["equal"] == n
    row = next(line for line in readme.splitlines() if line.startswith("| export to transformers"))
    assert f"within {e(exp['logits']['max_abs_diff'])} of PaddleNLP's" in row and "parity_smollm2.json" in row
