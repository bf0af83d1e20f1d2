"""Registry: names, `module:function`, `file.py:function`, and clear errors."""
import inspect

import pytest

from paddle_grpo import rewards
from paddle_grpo.rewards import available_rewards, get_reward_fn, register_reward

BUILTINS = ["gsm8k", "kk", "length_similarity", "rouge_l", "tag_format", "tag_format_strict"]


def test_builtins_registered():
    assert set(BUILTINS) <= set(available_rewards())
    assert available_rewards() == sorted(available_rewards())


@pytest.mark.parametrize("name", BUILTINS)
def test_builtins_accept_unknown_kwargs(name):
    # Seed 000's `TypeError: <lambda>() got an unexpected keyword argument 'completion_ids'` must not happen.
    fn = get_reward_fn(name)
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())
    out = fn(["prompt"], ["<answer>7</answer>"], tgt=["(1) Ann is a knight\n#### 7"], completion_ids=[[1, 2]],
             some_column=["x"])
    assert len(out) == 1


def test_unknown_name_lists_valid_ones():
    with pytest.raises(KeyError) as info:
        get_reward_fn("kkk")
    message = str(info.value)
    assert "unknown reward 'kkk'" in message
    for name in BUILTINS:
        assert name in message


def test_module_spec():
    assert get_reward_fn("paddle_grpo.rewards.kk:kk") is get_reward_fn("kk")
    with pytest.raises(ImportError, match="could not import module 'no_such_module_xyz'"):
        get_reward_fn("no_such_module_xyz:fn")
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        get_reward_fn("paddle_grpo.rewards.kk:nope")
    with pytest.raises(TypeError, match="not a function"):
        get_reward_fn("paddle_grpo.rewards.kk:TAGS")


def test_file_spec(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text("def length(prompts, completions, **kwargs):\n    return [float(len(c)) for c in completions]\n")
    fn = get_reward_fn(f"{path}:length")
    assert fn(None, ["abc", ""]) == [3.0, 0.0]
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_xyz\n")
    with pytest.raises(ImportError, match="broken.py failed: ModuleNotFoundError"):
        get_reward_fn(f"{broken}:fn")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        get_reward_fn(f"{tmp_path}/missing.py:fn")


def test_register_reward():
    @register_reward("test_registry_constant")
    def constant(prompts, completions, **kwargs):
        return [0.25] * len(completions)

    assert get_reward_fn("test_registry_constant") is constant
    assert "test_registry_constant" in available_rewards()
    with pytest.raises(ValueError, match="already registered"):
        register_reward("test_registry_constant")(lambda p, c, **k: [])
    with pytest.raises(ValueError, match="without ':'"):
        register_reward("a:b")
    rewards.unregister_reward("test_registry_constant")
    assert "test_registry_constant" not in available_rewards()
    with pytest.raises(KeyError, match="test_registry_constant"):
        rewards.unregister_reward("test_registry_constant")
