"""Prints one JSON line: the kernel-selecting environment variables this process sees and digests of a few float32
results (paddle matmul through MKL, its backward, softmax; numpy's OpenBLAS matmul), for tests/test_kernels.py.

    kernel_digest.py [OUT_PREFIX]     (with OUT_PREFIX, also writes OUT_PREFIX.rank{PADDLE_TRAINER_ID}.json)

Applies paddle_grpo.cpu_tuning first, as run_rl.py's model loading does, so the MKL path is the one training uses."""
import hashlib
import json
import os
import sys

import numpy as np
import paddle

from paddle_grpo import cpu_tuning

KERNEL_VARIABLES = ("MKL_DEBUG_CPU_TYPE", "MKL_ENABLE_INSTRUCTIONS", "OPENBLAS_CORETYPE", "OMP_NUM_THREADS")


def digest(x) -> str:
    return hashlib.sha1(np.ascontiguousarray(x).tobytes()).hexdigest()[:12]


def main() -> None:
    cpu_tuning.apply()
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 896)).astype("float32"), rng.standard_normal((896, 4864)).astype("float32")
    x = paddle.to_tensor(a[:, :256])
    w = paddle.to_tensor(b[:256, :320])
    w.stop_gradient = False
    product = paddle.matmul(paddle.to_tensor(a), paddle.to_tensor(b))
    paddle.nn.functional.log_softmax(paddle.matmul(x, w), -1).sum().backward()
    result = {"env": {k: os.environ.get(k) for k in KERNEL_VARIABLES},
              "paddle_matmul": digest(product.numpy()), "paddle_matmul_sum": f"{float(product.sum()):.4f}",
              "paddle_backward": digest(w.grad.numpy()),
              "paddle_softmax": digest(paddle.nn.functional.softmax(paddle.to_tensor(a), -1).numpy()),
              "numpy_matmul": digest(a @ b)}
    line = json.dumps(result, sort_keys=True)
    print(line)
    if len(sys.argv) > 1:
        with open(f"{sys.argv[1]}.rank{os.environ.get('PADDLE_TRAINER_ID', '0')}.json", "w") as f:
            f.write(line)


if __name__ == "__main__":
    main()
