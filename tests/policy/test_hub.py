"""Hub model IDs (policy/hub.py), offline: PaddleNLP's cache under a temporary PPNLP_HOME, a local HTTP server in
the role of PaddleNLP's download server (PPNLP_ENDPOINT), and the one error of an offline miss.

PaddleNLP reads PPNLP_HOME (and PPNLP_ENDPOINT) once, when it is first imported, so everything that needs another
cache or server runs in a subprocess with those variables set.
"""
import functools
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest
from dry_run_helpers import one_step_run_argv
from numerics import tiny_lm_tol

from paddle_grpo.policy.hub import is_complete_model_dir, looks_like_hub_id, missing_files, resolve_model_dir

MODEL_ID = "tiny-org/tiny-qwen2"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(args, home, endpoint, cwd, timeout=300):
    """`python ARGS` with PPNLP_HOME=home and PPNLP_ENDPOINT=endpoint (None: unset); the package from this tree."""
    env = {k: v for k, v in os.environ.items() if k not in ("PPNLP_ENDPOINT", "AISTUDIO_BOS_OFFLINE")}
    env.update(PPNLP_HOME=str(home), PYTHONPATH=os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")])))
    if endpoint is not None:
        env["PPNLP_ENDPOINT"] = endpoint
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


class _Recording(http.server.SimpleHTTPRequestHandler):
    requests: list

    def log_message(self, *args):  # keep the test output clean; the request lines are recorded instead
        pass

    def send_head(self):
        self.requests.append((self.command, self.path))
        return super().send_head()


@pytest.fixture
def model_server(tmp_path):
    """A real HTTP server on 127.0.0.1 laid out as PaddleNLP's BOS endpoint (`models/community/<ID>/<file>`),
    serving nothing until a test copies a model there; yields (url, root, requests)."""
    root = tmp_path / "bos"
    (root / "models" / "community").mkdir(parents=True)
    requests = []
    handler = type("Handler", (_Recording,), {"requests": requests})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root, requests
    server.shutdown()
    server.server_close()


@pytest.fixture
def silent_endpoint():
    """A TCP port that accepts connections (the kernel's backlog) but never answers: a network dropping replies."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


@pytest.fixture
def refused_endpoint():
    """A free port with nothing listening: connections are refused at once."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


def cached_home(tmp_path, tiny_policy_dir):
    """A PPNLP_HOME whose model cache holds the tiny policy as MODEL_ID, in PaddleNLP's layout."""
    home = tmp_path / "ppnlp"
    shutil.copytree(tiny_policy_dir, home / "models" / MODEL_ID)
    return home


# ------------------------------------------------------------------------------------------------ in process

@pytest.mark.parametrize("name, expected", [
    ("Qwen/Qwen2.5-7B-Instruct-1M", True), ("meta-llama/Meta-Llama-3.1-8B", True), ("bert-base-uncased", True),
    ("/abs/model", False), ("./model", False), ("../model", False), ("~/model", False), ("a/b/c", False),
    ("org/name/", False), ("", False),
])
def test_which_names_are_hub_ids(name, expected):
    assert looks_like_hub_id(name) is expected


def test_a_local_directory_is_returned_as_is(tiny_policy_dir):
    assert resolve_model_dir(tiny_policy_dir) == tiny_policy_dir
    assert is_complete_model_dir(tiny_policy_dir) and missing_files(tiny_policy_dir) == []


def test_a_missing_path_is_not_looked_up_on_the_hub(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"lora_base: '{tmp_path / 'nope'}' is not a local model directory"):
        resolve_model_dir(str(tmp_path / "nope"), key="lora_base")


def test_missing_files_names_what_a_partial_cache_lacks(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert missing_files(str(tmp_path)) == [
        "tokenizer_config.json",
        "model.safetensors.index.json or model_state.pdparams.index.json or model.safetensors or model_state.pdparams"]
    (tmp_path / "tokenizer_config.json").write_text("{}")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"x")
    assert missing_files(str(tmp_path)) == ["model-00002-of-00002.safetensors"]
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"x")
    assert is_complete_model_dir(str(tmp_path))


def test_pytorch_pickled_weights_are_named_with_how_to_convert_them(tmp_path):
    from paddle_grpo.dry_run import model_dir_problems
    from paddle_grpo.policy.hub import torch_pickle_note

    for name in ("config.json", "tokenizer_config.json", "pytorch_model.bin"):
        (tmp_path / name).write_bytes(b"{}")
    [problem] = model_dir_problems(str(tmp_path), "actor_model_name_or_path")
    assert problem.startswith(f"actor_model_name_or_path: '{tmp_path}' is not a whole model directory (as "
                              "save_pretrained writes it): it lacks model.safetensors.index.json or ")
    assert problem.endswith(torch_pickle_note(str(tmp_path)))
    assert "PyTorch's pickle (pytorch_model.bin)" in problem and ".save_pretrained(d + '-st')" in problem
    (tmp_path / "model.safetensors").write_bytes(b"x")  # loadable weights beside it: nothing to say
    assert torch_pickle_note(str(tmp_path)) == ""


def test_a_partial_cache_offline_names_the_missing_files(tmp_path, monkeypatch, refused_endpoint):
    # In process: point this process's PaddleNLP at a temporary cache and a refused server (module attributes).
    import paddlenlp.utils.env as env

    bos = sys.modules["paddlenlp.utils.download.bos_download"]
    monkeypatch.setattr(env, "MODEL_HOME", str(tmp_path / "models"))
    monkeypatch.setattr(bos, "ENDPOINT", refused_endpoint)
    monkeypatch.setenv("PPNLP_HOME", str(tmp_path))
    cache = tmp_path / "models" / "org" / "partial"
    cache.mkdir(parents=True)
    (cache / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError) as e:
        resolve_model_dir("org/partial", timeout=5)
    message = str(e.value)
    assert message.startswith("actor_model_name_or_path: 'org/partial' is not a local directory, and hub model "
                              f"'org/partial' is not in PaddleNLP's model cache (searched {cache}: it holds "
                              "['config.json'] but lacks tokenizer_config.json, model.safetensors.index.json or")
    assert f"PPNLP_HOME={tmp_path})" in message
    assert f"PaddleNLP's download server {refused_endpoint} is unreachable (ConnectionError" in message


# ------------------------------------------------------------------------------------------- in a subprocess

CACHE_HIT = '''
import json, os, sys
import numpy as np, paddle
from paddle_grpo.policy import is_encoder_decoder, load_policy, load_tokenizer, resolve_model_dir
model_id, local = sys.argv[1:]
cache = resolve_model_dir(model_id)
hub, direct = load_policy(model_id, trainable=False), load_policy(local, trainable=False)
state = paddle.load(os.path.join(local, "model_state.pdparams"))
weights_equal = all(np.array_equal(p.numpy(), q.numpy()) for p, q in zip(hub.model.parameters(),
                                                                         direct.model.parameters()))
file_equal = all(np.array_equal(v.numpy(), state[k].numpy()) for k, v in hub.model.state_dict().items())
t_hub, t_dir = load_tokenizer(model_id), load_tokenizer(local)
text = "<|im_start|>user\\nWho is Zoey? 12 + 35<|im_end|>"
print(json.dumps(dict(cache=cache, n=len(hub.model.parameters()), weights_equal=weights_equal, file_equal=file_equal,
                      ids=[t_hub(text)["input_ids"], t_dir(text)["input_ids"]],
                      vocab=t_hub.get_vocab() == t_dir.get_vocab(), pad=[t_hub.pad_token_id, t_dir.pad_token_id],
                      seq2seq=is_encoder_decoder(model_id))))
'''


def test_a_hub_id_is_downloaded_into_the_cache_then_loads_exactly_the_local_model(tmp_path, tiny_policy_dir,
                                                                                   model_server):
    """A first process resolves the ID: PaddleNLP downloads every file into its cache. A second process (the cache
    now populated) loads policy and tokenizer by the ID without asking the server, equal to loading the local
    directory. (Two tests before, each starting a process that imports paddle; the download left the cache the
    second needed.)"""
    url, root, requests = model_server
    shutil.copytree(tiny_policy_dir, root / "models" / "community" / MODEL_ID)
    home = tmp_path / "ppnlp"
    code = "import sys; from paddle_grpo.policy import resolve_model_dir; print(resolve_model_dir(sys.argv[1]))"
    out = run(["-c", code, MODEL_ID], home, url, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    cache = home / "models" / MODEL_ID
    assert out.stdout.strip().splitlines()[-1] == str(cache)
    for name in os.listdir(tiny_policy_dir):  # every file of the model, byte for byte
        assert (cache / name).read_bytes() == open(os.path.join(tiny_policy_dir, name), "rb").read(), name
    assert ("GET", f"/models/community/{MODEL_ID}/model_state.pdparams") in requests
    # Now cached: another process resolves and loads it without asking the server again.
    before = len(requests)
    out = run(["-c", CACHE_HIT, MODEL_ID, tiny_policy_dir], home, url, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["cache"] == str(cache)
    assert result["n"] > 0 and result["weights_equal"] and result["file_equal"]
    assert result["ids"][0] == result["ids"][1] and len(result["ids"][0]) > 5
    assert result["vocab"] and result["pad"][0] == result["pad"][1] is not None
    assert result["seq2seq"] is False
    assert len(requests) == before  # a cache hit never asks the server


def test_a_one_step_run_starts_from_a_hub_id(tmp_path, tiny_policy_dir, refused_endpoint):
    home = cached_home(tmp_path, tiny_policy_dir)
    argv, out_dir = one_step_run_argv(tmp_path, MODEL_ID)
    out = run(argv, home, refused_endpoint, cwd=tmp_path)  # the server is unreachable: the cache must suffice
    assert out.returncode == 0, out.stderr[-3000:]
    with open(out_dir / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == [1] and rows[0]["response_length/max"] <= 8


def test_a_cached_hub_model_that_cannot_convert_is_one_error_not_a_traceback(tmp_path, tiny_policy_dir,
                                                                          refused_endpoint):
    """A hub ID whose cached safetensors neither PaddleNLP loads nor hf_weights converts (here metadata format
    "tf") is only found when the run resolves the ID (preflight looks up no hub ID): exit 2 and one line naming the
    key and the file's problem, like every other setup error."""
    from safetensors.numpy import save_file

    home = cached_home(tmp_path, tiny_policy_dir)
    cache = home / "models" / MODEL_ID
    state = paddle_state(cache / "model_state.pdparams")
    os.remove(cache / "model_state.pdparams")
    save_file(state, str(cache / "model.safetensors"), metadata={"format": "tf"})
    argv, _ = one_step_run_argv(tmp_path, MODEL_ID)
    out = run(argv, home, refused_endpoint, cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    [line] = [x for x in out.stderr.splitlines() if x.startswith("run_rl.py: error:")]
    assert line.startswith("run_rl.py: error: actor_model_name_or_path: "), line
    assert "format 'tf'" in line and str(cache) in line, line


def paddle_state(path):
    """{name: numpy array} of a .pdparams file: what the safetensors library writes."""
    import numpy as np
    import paddle

    return {k: np.ascontiguousarray(v.numpy()) for k, v in paddle.load(str(path)).items()}


@pytest.mark.parametrize("endpoint_kind", ["silent", "refused"])
def test_an_offline_miss_is_one_error_naming_the_id_and_the_cache(tmp_path, endpoint_kind, request):
    endpoint = request.getfixturevalue(f"{endpoint_kind}_endpoint")
    home = tmp_path / "ppnlp"
    (tmp_path / "train.jsonl").write_text('{"src": "q", "tgt": "a"}\n')
    start = time.monotonic()
    out = run([os.path.join(REPO, "run_rl.py"), "--actor_model_name_or_path", "tiny-org/absent-model",
               "--use_rm_server", "false", "--reward_funcs", "kk", "--train_datasets", tmp_path / "train.jsonl",
               "--output_dir", tmp_path / "o"], home, endpoint, cwd=tmp_path, timeout=120)
    elapsed = time.monotonic() - start
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    cache = home / "models" / "tiny-org" / "absent-model"
    assert (f"run_rl.py: error: actor_model_name_or_path: 'tiny-org/absent-model' is not a local directory, and "
            f"hub model 'tiny-org/absent-model' is not in PaddleNLP's model cache (searched {cache}: it does not "
            f"exist; PPNLP_HOME={home}) and cannot be downloaded: PaddleNLP's download server {endpoint} ") \
        in out.stderr
    why = "did not answer within 10 s" if endpoint_kind == "silent" else "is unreachable (ConnectionError"
    assert why in out.stderr
    # One attempt, not a retry loop: the silent endpoint costs its 10 s read timeout once. The bound is wide because
    # the process also imports paddle and paddlenlp (5-20 s on 2 loaded cores); several 10 s attempts would pass it.
    assert elapsed < 60, elapsed


def test_lora_adapters_record_the_hub_id_and_merge_through_the_cache(tmp_path, tiny_policy_dir, monkeypatch,
                                                                      refused_endpoint):
    import numpy as np
    import paddle
    import paddlenlp.utils.env as env

    from lora_helpers import randomize_adapters
    from paddle_grpo.policy import lora as L
    from paddle_grpo.policy.causal import load_causal_lm

    monkeypatch.setattr(env, "MODEL_HOME", str(tmp_path / "models"))
    monkeypatch.setattr(sys.modules["paddlenlp.utils.download.bos_download"], "ENDPOINT", refused_endpoint)
    shutil.copytree(tiny_policy_dir, tmp_path / "models" / MODEL_ID)
    model = L.apply_lora(load_causal_lm(MODEL_ID), rank=4, alpha=8, base_model_name_or_path=MODEL_ID)
    rng = np.random.default_rng(0)
    randomize_adapters(model, rng)
    adapters = str(tmp_path / "adapters")
    L.save_adapters(model, adapters)
    assert L.read_adapter_config(adapters).base_model_name_or_path == MODEL_ID  # portable: the ID, not a cache path
    ids = paddle.to_tensor(rng.integers(3, model.config.vocab_size, size=(2, 10)), dtype="int64")
    with paddle.no_grad():
        expected = model(input_ids=ids, return_dict=True).logits.numpy()
    L.merge_into_base(None, adapters, str(tmp_path / "merged"), check=False)
    merged = load_causal_lm(str(tmp_path / "merged"), trainable=False)
    # Merged weights W + scale * A B against the adapters applied beside W: each weight is rounded once more, and
    # every sum of the forward sees other terms, so the logits of conftest's tiny policy (hidden 64, intermediate
    # 128, 2 layers) differ within tests/numerics.py's tiny_lm_tol.
    with paddle.no_grad():
        np.testing.assert_allclose(merged(input_ids=ids, return_dict=True).logits.numpy(), expected,
                                   atol=tiny_lm_tol(128, 2, 0))


def test_download_false_reads_the_cache_only(tmp_path, tiny_policy_dir, monkeypatch, model_server):
    import paddlenlp.utils.env as env

    url, root, requests = model_server
    shutil.copytree(tiny_policy_dir, root / "models" / "community" / MODEL_ID)  # available, but must not be fetched
    monkeypatch.setattr(env, "MODEL_HOME", str(tmp_path / "models"))
    monkeypatch.setattr(sys.modules["paddlenlp.utils.download.bos_download"], "ENDPOINT", url)
    with pytest.raises(FileNotFoundError, match=r"cannot be downloaded: not attempted \(download=False\)"):
        resolve_model_dir(MODEL_ID, download=False)
    assert requests == [] and not (tmp_path / "models" / MODEL_ID).exists()
    shutil.copytree(tiny_policy_dir, tmp_path / "models" / MODEL_ID)
    assert resolve_model_dir(MODEL_ID, download=False) == str(tmp_path / "models" / MODEL_ID)


def test_the_wait_for_a_silent_server_is_bounded_by_the_timeout(tmp_path, monkeypatch, silent_endpoint):
    import paddlenlp.utils.env as env

    monkeypatch.setattr(env, "MODEL_HOME", str(tmp_path / "models"))
    monkeypatch.setattr(sys.modules["paddlenlp.utils.download.bos_download"], "ENDPOINT", silent_endpoint)
    start = time.monotonic()
    with pytest.raises(FileNotFoundError, match=f"download server {silent_endpoint} did not answer within 2 s"):
        resolve_model_dir("tiny-org/absent-model", timeout=2)
    assert 1.9 <= time.monotonic() - start < 5


def test_long_messages_are_cut_at_a_word_boundary():
    """The offline hub-ID message quotes requests' / PaddleNLP's error, which can run to kilobytes: cut, never
    mid-word, and marked."""
    from paddle_grpo.policy.hub import shorten

    text = "HTTPSConnectionPool(host='bj.bcebos.com', port=443): Max retries exceeded with url " * 10
    short = shorten(text, 200)
    assert len(short) <= 206 and short.endswith(" [...]")
    assert text.startswith(short[:-len(" [...]")] + " ")  # whole words only
    assert shorten("a  b\n c", 200) == "a b c"
