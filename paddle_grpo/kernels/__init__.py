"""Numpy and paddle twins of the hot CPU work: tensors in, tensors out, no model code and no ranks.

- numpy_kernels.py: numpy over paddle's own CPU memory (writable views, a thread per core) and the switch between
  the numpy and paddle-op implementations;
- chunk_kernels.py and chunked_head.py: the chunked LM head (per-chunk statistics and gradients; the
  `paddle.autograd.PyLayer` that walks the positions a chunk at a time);
- attention.py: attention over blocks of queries; mlp.py: the blocked SwiGLU MLP; norm.py: RMSNorm with a
  backward whose reductions are matrix products; prefix_attention.py: a decode step's attention over one copy of
  each prompt's keys and values for all its samples; decode_attention.py: the same in the per-row layout;
- gemm.py (with mkl.py and onednn.py): products of few rows by weights packed once (MKL's packed API, oneDNN's
  matmul primitive through ctypes on paddle's own libraries, numpy), float32 or bfloat16, the backend from a
  table measured per CPU family: the CPU decode engine's (policy/decode_engine.py).

The bottom floor of the package (docs/architecture.md): policy/ (the models) and parallel/ (the vocab-parallel head,
gradient norms) both use it; it imports only algorithms/ (pure maths).
"""
