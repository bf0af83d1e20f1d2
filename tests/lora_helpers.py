"""Shared by the LoRA tests (tests/tools/test_merge_lora.py, tests/policy/test_hub.py)."""
import numpy as np
import paddle


def randomize_adapters(model: paddle.nn.Layer, rng: np.random.Generator, std: float = 0.2) -> None:
    """Give every LoRA A and B matrix random values (fresh adapters have B = 0, so they would change nothing), then
    switch the model to eval mode."""
    with paddle.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.set_value(paddle.to_tensor(rng.normal(0, std, size=p.shape).astype("float32")))
    model.eval()
