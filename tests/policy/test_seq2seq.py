"""paddle_grpo.seq2seq against independent references: per-row plain forwards of the model (no padding, no cache, no
shared encoder) with log-softmax, argmax and the sampling rules done in numpy.

Tiny random T5 and BART models: T5 has relative positions (padding side is harmless), BART learned absolute ones
(left padding would shift them), so both are needed to check the packing of encoder inputs.

Tolerances (tests/numerics.py): batched, padded, cached passes against per-row plain forwards run other GEMM shapes,
so other kernels: log-probs and entropies within MODEL_TOL (tiny_lm_tol of d_model 32, ffn 64, 2 encoder + 2 decoder
layers, counted as 6 for the decoders' cross-attention, vocab 300), gradients twice that. Token choices are compared
exactly: keyed sampling turns equal keys into equal tokens unless a probability lands within rounding of a sampling
boundary (chance ~u per draw).
"""
import shutil

import numpy as np
import paddle
import pytest
from numerics import tiny_lm_tol

from paddle_grpo.policy import seq2seq
from paddle_grpo.recipes.seq2seq import build_tiny_seq2seq
from paddle_grpo.recipes.tiny import build_tokenizer
from paddle_grpo.rollout.sampling import row_keys

pytestmark = pytest.mark.numerics  # compares float results: CI reruns it on other CPU kernels

MODEL_TOL = tiny_lm_tol(64, 6, 300)  # 4.6e-4

CORPUS = [
    "summarize: Researchers at the Ostley Guild have discovered a new species of snail near Morholm. The team was "
    "led by designer Quineth Thornford.",
    "The Ostley Guild discovered a new species of snail near Morholm.",
    "summarize: On Tuesday the Morham Harriers won the Valley Cup, beating Vellmouth Harriers 5 to 1.",
] * 5
TEXTS = ["summarize: The Ostley Guild found a snail.", "summarize: On Tuesday the Harriers won the cup, beating "
         "Vellmouth 5 to 1 in Morholm.", "summarize: Quineth"]


@pytest.fixture(scope="module", params=["t5", "bart"])
def tiny(request, tmp_path_factory):
    """(directory, tokenizer, model) of a tiny random encoder-decoder, loaded the way the trainer loads it."""
    path = str(tmp_path_factory.mktemp(f"tiny_{request.param}"))
    tokenizer, _ = build_tiny_seq2seq(path, CORPUS, arch=request.param, vocab_size=300, d_model=32,
                                              ffn_dim=64, num_heads=4, seed=3)
    return path, tokenizer, seq2seq.load_seq2seq_lm(path)


def _prompts(tokenizer, side="left"):
    """The token lists of TEXTS and a [B, L] batch padded on `side` (numpy int64)."""
    lists = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    L = max(map(len, lists))
    ids = np.full((len(lists), L), tokenizer.pad_token_id, dtype=np.int64)
    mask = np.zeros((len(lists), L), dtype=np.int64)
    for i, row in enumerate(lists):
        cols = slice(L - len(row), L) if side == "left" else slice(0, len(row))
        ids[i, cols], mask[i, cols] = row, 1
    return lists, ids, mask


def _plain_logits(model, src, decoder_input):
    """Logits [t, V] float64 of one unpadded row through the model's own forward (encoder included)."""
    out = model(input_ids=paddle.to_tensor([src], dtype="int64"),
                attention_mask=paddle.ones([1, len(src)], dtype="int64"),
                decoder_input_ids=paddle.to_tensor([decoder_input], dtype="int64"), use_cache=False,
                return_dict=True)
    return out.logits[0].numpy().astype(np.float64)


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _naive_greedy(model, src, *, max_new, min_new, eos, penalty=1.0):
    """Greedy decoding by re-running the whole model each step; the rules of rollout/single_turn.py, written out."""
    start = seq2seq.decoder_start_id(model)
    out, seen = [], set()
    for t in range(max_new):
        z = _plain_logits(model, src, [start] + out)[-1]
        for v in seen:  # repetition penalty on the decoder's own tokens only
            z[v] = z[v] / penalty if z[v] > 0 else z[v] * penalty
        if t < min_new:
            z[list(eos)] = -np.inf
        token = int(np.argmax(z))
        out.append(token)
        if token in eos:
            break
        seen.add(token)
    return out


# ---------------------------------------------------------------------------------------------------- loading


def test_load_detects_and_disables_dropout(tiny, tmp_path, tiny_policy_dir):
    from paddlenlp.transformers import AutoConfig

    path, _, model = tiny
    assert seq2seq.is_encoder_decoder(path) and seq2seq.is_encoder_decoder(model)
    assert not seq2seq.is_encoder_decoder(tiny_policy_dir)
    with pytest.raises(ValueError, match="is_encoder_decoder"):
        seq2seq.load_seq2seq_lm(tiny_policy_dir)
    with pytest.raises(NotImplementedError):
        seq2seq.load_seq2seq_lm(path, tensor_parallel_degree=2)
    # A checkpoint saved with dropout loads without it: two training-mode forwards agree.
    noisy = tmp_path / "noisy"
    shutil.copytree(path, noisy)
    config = AutoConfig.from_pretrained(str(noisy))
    for key in ("dropout_rate", "dropout", "attention_dropout", "activation_dropout"):
        if hasattr(config, key):
            setattr(config, key, 0.5)
    config.save_pretrained(str(noisy))
    policy = seq2seq.load_seq2seq_lm(str(noisy))
    assert policy.training and not any(p.stop_gradient for p in policy.parameters())
    ids = paddle.to_tensor([[5, 6, 7, 8]])
    a = policy(input_ids=ids, decoder_input_ids=ids, use_cache=False, return_dict=True).logits
    b = policy(input_ids=ids, decoder_input_ids=ids, use_cache=False, return_dict=True).logits
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    frozen = seq2seq.load_seq2seq_lm(path, trainable=False)
    assert not frozen.training and all(p.stop_gradient for p in frozen.parameters())


# ----------------------------------------------------------------------------------------------------- log-probs


def test_completion_logprobs_match_plain_forward(tiny):
    """Mixed padding sides, repeated rows (shared encoder), temperature: values, entropies and gradients."""
    _, tokenizer, model = tiny
    lists, left_ids, left_mask = _prompts(tokenizer, "left")
    _, right_ids, right_mask = _prompts(tokenizer, "right")
    # rows: prompt 0 left-padded twice (one encoder run), prompt 1 right-padded, prompt 2 left-padded
    rows = [(0, left_ids, left_mask), (0, left_ids, left_mask), (1, right_ids, right_mask), (2, left_ids, left_mask)]
    prompt_ids = np.stack([ids[i] for i, ids, _ in rows])
    prompt_mask = np.stack([mask[i] for i, _, mask in rows])
    rng = np.random.default_rng(0)
    lengths = np.array([5, 2, 7, 1])
    T = 7
    completion = rng.integers(3, len(tokenizer), size=(len(rows), T))
    completion_mask = (np.arange(T)[None] < lengths[:, None]).astype(np.int64)
    temperature = 0.7
    lp, ent = seq2seq.completion_logprobs(model, paddle.to_tensor(prompt_ids), paddle.to_tensor(prompt_mask),
                                          paddle.to_tensor(completion), paddle.to_tensor(completion_mask),
                                          temperature=temperature, with_entropy=True)
    assert lp.shape == [len(rows), T] and ent.shape == [len(rows), T]
    start = seq2seq.decoder_start_id(model)
    reference_loss = 0.0
    for r, (i, _, _) in enumerate(rows):
        n = lengths[r]
        z = _plain_logits(model, lists[i], [start] + completion[r, :n - 1].tolist()) / temperature
        logp = _log_softmax(z)
        np.testing.assert_allclose(lp.numpy()[r, :n], logp[np.arange(n), completion[r, :n]], atol=MODEL_TOL)
        np.testing.assert_allclose(ent.numpy()[r, :n], -(np.exp(logp) * logp).sum(-1), atol=MODEL_TOL)
    # Gradients through the shared encoder equal those of separate per-row forwards.
    model.clear_gradients()
    (lp * paddle.to_tensor(completion_mask, dtype="float32")).sum().backward()
    got = {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}
    model.clear_gradients()
    for r, (i, _, _) in enumerate(rows):
        n = lengths[r]
        out = model(input_ids=paddle.to_tensor([lists[i]]), attention_mask=paddle.ones([1, len(lists[i])], "int64"),
                    decoder_input_ids=paddle.to_tensor([[start] + completion[r, :n - 1].tolist()]), use_cache=False,
                    return_dict=True)
        logp = paddle.nn.functional.log_softmax(out.logits[0] / temperature, axis=-1)
        reference_loss = reference_loss + paddle.take_along_axis(
            logp, paddle.to_tensor(completion[r, :n, None]), axis=-1).sum()
    reference_loss.backward()
    want = {n: p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None}
    model.clear_gradients()
    assert got.keys() == want.keys() and any("encoder" in n for n in got)
    for n in got:
        np.testing.assert_allclose(got[n], want[n], atol=2 * MODEL_TOL, rtol=1e-4, err_msg=n)


def test_vocab_parallel_is_refused(tiny):
    _, _, model = tiny
    one = paddle.ones([1, 2], dtype="int64")
    with pytest.raises(NotImplementedError):
        seq2seq.completion_logprobs(model, one, one, one, one, vocab_parallel=object())


# ------------------------------------------------------------------------------------------------------ generate


@pytest.mark.parametrize("min_new,penalty", [(0, 1.0), (3, 1.0), (0, 3.0)])
def test_greedy_matches_naive_loop(tiny, min_new, penalty):
    """Cached greedy decoding == re-running the whole model each step; EOS, min length, padding after EOS."""
    _, tokenizer, model = tiny
    lists, ids, mask = _prompts(tokenizer, "left")
    max_new = 8
    # Make a token the greedy path of prompt 0 produces at step 2 an extra EOS, so some rows stop early.
    path0 = _naive_greedy(model, lists[0], max_new=max_new, min_new=0, eos={tokenizer.eos_token_id})
    eos = {tokenizer.eos_token_id, path0[min(2, len(path0) - 1)]}
    pad = tokenizer.pad_token_id
    G = 2
    r = seq2seq.generate(model, ids, mask, num_samples=G, max_new_tokens=max_new, min_new_tokens=min_new,
                         eos_token_ids=sorted(eos), pad_token_id=pad, do_sample=False, repetition_penalty=penalty)
    T = r.completion_ids.shape[1]
    assert r.prompt_ids.shape == [len(lists) * G, ids.shape[1]]
    np.testing.assert_array_equal(r.prompt_ids.numpy(), np.repeat(ids, G, axis=0))
    for row in range(len(lists) * G):
        want = _naive_greedy(model, lists[row // G], max_new=max_new, min_new=min_new, eos=eos, penalty=penalty)
        n = len(want)
        assert r.lengths[row] == n
        assert r.truncated[row] == (want[-1] not in eos)
        np.testing.assert_array_equal(r.completion_ids.numpy()[row, :n], want)
        assert (r.completion_ids.numpy()[row, n:] == pad).all()
        np.testing.assert_array_equal(r.completion_mask.numpy()[row], (np.arange(T) < n).astype(np.int64))
        assert (r.sample_logprobs.numpy()[row, n:] == 0).all()
        if min_new:
            assert not set(want[:min_new]) & eos
    assert T == r.lengths.max()
    if min_new == 0 and penalty == 1.0:
        assert not r.truncated.all() and r.lengths.min() < max_new  # the EOS path was exercised


def test_repetition_penalty_ignores_the_source(tiny):
    """A summary may copy the document: only the decoder's own tokens are penalised (unlike rollout/'s prompts)."""
    _, tokenizer, model = tiny
    src = list(range(4, len(tokenizer), 2))  # half the vocabulary in the document
    eos = {tokenizer.eos_token_id}
    want = _naive_greedy(model, src, max_new=8, min_new=8, eos=eos, penalty=50.0)
    assert set(want) & set(src)  # the greedy path copies from the source, so penalising it would change the path
    r = seq2seq.generate(model, np.array([src]), np.ones((1, len(src)), dtype=np.int64), max_new_tokens=8,
                         min_new_tokens=8, eos_token_ids=sorted(eos), do_sample=False, repetition_penalty=50.0)
    np.testing.assert_array_equal(r.completion_ids.numpy()[0], want)


@pytest.mark.parametrize("side", ["left", "right"])
def test_sample_logprobs_equal_recomputation(tiny, side):
    """The rollout's log-probs (temperature only, before penalty/min-length/top-p) == completion_logprobs."""
    _, tokenizer, model = tiny
    _, ids, mask = _prompts(tokenizer, side)
    G = 3
    r = seq2seq.generate(model, ids, mask, num_samples=G, max_new_tokens=10, min_new_tokens=2,
                         eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id,
                         temperature=0.7, top_p=0.9, repetition_penalty=1.3,
                         row_keys=row_keys(5, 0, np.arange(len(ids) * G)))
    lp, _ = seq2seq.completion_logprobs(model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask,
                                        temperature=0.7)
    m = r.completion_mask.numpy().astype(bool)
    np.testing.assert_allclose(lp.numpy()[m], r.sample_logprobs.numpy()[m], atol=MODEL_TOL)
    assert (r.lengths >= 2).all()


def test_keyed_sampling_does_not_depend_on_chunking_or_padding(tiny):
    _, tokenizer, model = tiny
    _, ids, mask = _prompts(tokenizer, "left")
    _, right_ids, right_mask = _prompts(tokenizer, "right")
    G, B = 4, len(ids)
    keys = row_keys(7, 3, np.arange(B * G))
    kw = dict(num_samples=G, max_new_tokens=8, eos_token_ids=[tokenizer.eos_token_id],
              pad_token_id=tokenizer.pad_token_id, temperature=1.2)
    whole = seq2seq.generate(model, ids, mask, row_keys=keys, **kw)
    chunked = seq2seq.generate(model, ids, mask, row_keys=keys, max_num_seqs=G, **kw)
    alone = seq2seq.generate(model, ids[1:2], mask[1:2], row_keys=keys[G:2 * G], **kw)  # another rank's share
    right = seq2seq.generate(model, right_ids, right_mask, row_keys=keys, **kw)
    for other, rows in ((chunked, slice(None)), (alone, slice(G, 2 * G)), (right, slice(None))):
        n = other.completion_ids.shape[1]
        np.testing.assert_array_equal(other.completion_ids.numpy(), whole.completion_ids.numpy()[rows, :n])
        np.testing.assert_array_equal(other.lengths, whole.lengths[rows])
        np.testing.assert_allclose(other.sample_logprobs.numpy(), whole.sample_logprobs.numpy()[rows, :n],
                                   atol=MODEL_TOL)
    # Different keys give different samples (the keys are used at all).
    other_keys = seq2seq.generate(model, ids, mask, row_keys=row_keys(8, 3, np.arange(B * G)), **kw)
    assert not np.array_equal(other_keys.completion_ids.numpy()[:, :4], whole.completion_ids.numpy()[:, :4])
    # Without keys: paddle's generator, reproducible under paddle.seed.
    paddle.seed(11)
    a = seq2seq.generate(model, ids, mask, **kw)
    paddle.seed(11)
    b = seq2seq.generate(model, ids, mask, **kw)
    np.testing.assert_array_equal(a.completion_ids.numpy(), b.completion_ids.numpy())


def test_generate_restores_training_mode_and_needs_eos(tiny):
    _, tokenizer, model = tiny
    _, ids, mask = _prompts(tokenizer)
    model.train()
    seq2seq.generate(model, ids, mask, max_new_tokens=2, eos_token_ids=[tokenizer.eos_token_id], do_sample=False)
    assert model.training
    with pytest.raises(ValueError, match="EOS"):
        seq2seq.generate(model, ids, mask, max_new_tokens=2, eos_token_ids=[])


def test_tools_are_refused_naming_the_key(tiny):
    """Multi-turn rollouts need a decoder-only policy: the `tools` key is named, and the stepper refuses `keep`."""
    _, tokenizer, model = tiny
    _, ids, mask = _prompts(tokenizer)
    with pytest.raises(ValueError, match="`tools` key .* decoder-only"):
        seq2seq.generate(model, ids, mask, max_new_tokens=2, eos_token_ids=[tokenizer.eos_token_id], tools=object())
    stepper = seq2seq.Seq2SeqStepper(model)
    logits = stepper.start(paddle.to_tensor(ids), paddle.to_tensor(mask), 1)
    token = paddle.argmax(logits, axis=-1)
    with pytest.raises(ValueError, match="`tools`"):
        stepper.step(token, paddle.ones([ids.shape[0]], dtype="bool"))
    assert stepper.step(token).shape == logits.shape  # without keep: the usual step


def test_encoder_inputs_carry_the_tokenizers_own_special_tokens(tmp_path):
    """T5 was pre-trained on `ids </s>`: the encoder input must end with EOS exactly as PaddleNLP's tokenizer call
    with special tokens builds it (a real T5Tokenizer on a locally trained sentencepiece model); Qwen2's tokenizer
    adds nothing."""
    import sentencepiece as spm
    from paddlenlp.transformers import T5Tokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"summarise report {i} about the weather and the sea" for i in range(200)))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "spiece"), vocab_size=40, pad_id=0,
                                   eos_id=1, unk_id=2, bos_id=-1, minloglevel=2)
    t5 = T5Tokenizer(str(tmp_path / "spiece.model"))
    ids = t5("the weather report", add_special_tokens=False)["input_ids"]
    got = seq2seq.encoder_input_ids(t5, ids)
    assert got == t5("the weather report")["input_ids"] == ids + [t5.eos_token_id]

    qwen = build_tokenizer(CORPUS, str(tmp_path / "qwen"), vocab_size=300)
    ids = qwen("the weather report", add_special_tokens=False)["input_ids"]
    assert seq2seq.encoder_input_ids(qwen, ids) == ids
