"""setup.py: a GPU paddle already in the target environment keeps the CPU build out of the requirements."""
import importlib.util
import sysconfig


def load_setup(repo_root):
    spec = importlib.util.spec_from_file_location("paddle_grpo_setup", repo_root / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not __main__: setup() is not called
    return module


def test_gpu_paddle_in_the_environment_is_detected(repo_root, tmp_path):
    setup = load_setup(repo_root)
    purelib = sysconfig.get_paths(vars={"base": str(tmp_path), "platbase": str(tmp_path)})["purelib"]
    assert setup.gpu_paddle_installed(prefix=str(tmp_path)) is False
    (tmp_path / purelib).mkdir(parents=True, exist_ok=True)
    (tmp_path / purelib / "paddlepaddle-3.3.1.dist-info").mkdir()
    assert setup.gpu_paddle_installed(prefix=str(tmp_path)) is False  # the CPU build is not a GPU build
    (tmp_path / purelib / "paddlepaddle_gpu-3.3.1.dist-info").mkdir()
    assert setup.gpu_paddle_installed(prefix=str(tmp_path)) is True


def test_cpu_requirements_name_paddle_and_the_pins(repo_root):
    reqs = load_setup(repo_root).INSTALL_REQUIRES
    assert any(r.startswith("paddlepaddle>=3") for r in reqs)  # this test environment has no GPU paddle
    for pin in ("paddlenlp==3.0.0b4", "aistudio-sdk<0.3", "numpy<=1.26.4", "pyarrow>=21,<26"):
        assert pin in reqs


def test_the_peer_environment_leaves_the_project_requirements_out(repo_root):
    """`.[peer]` (tools/bench/trl_bench.py) is installed with PADDLE_GRPO_PEER_ONLY=1 into its own environment: TRL's
    transformers and paddlenlp 3.0.0b4 need different tokenizers, so none of the project's requirements go there."""
    setup = load_setup(repo_root)
    assert setup.requirements({"PADDLE_GRPO_PEER_ONLY": "1"}) == []
    assert setup.requirements({}) == setup.requirements({"PADDLE_GRPO_PEER_ONLY": "0"}) == setup.INSTALL_REQUIRES
    assert setup.PEER == ["torch==2.13.0", "trl==1.16.0"]  # the versions docs/PERFORMANCE.md was measured with
