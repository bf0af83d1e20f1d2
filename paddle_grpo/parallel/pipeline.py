"""Pipeline parallelism: which stage holds which layers (as PaddleNLP's pipeline models split them), the p2p pair
groups a gloo pipeline needs, and `Pipeline`, which trains this rank's stage through fleet's scheduler
(docs/distributed.md)."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import paddle
import paddle.distributed as dist

from ..config import ConfigError

if TYPE_CHECKING:
    from .context import ParallelContext


def pipeline_pairs(ranks: list[int]) -> list[tuple[int, int]]:
    """The 2-rank groups a gloo pipeline of `ranks` (global ranks in stage order) routes its p2p through: each pair of
    neighbouring stages, the last and the first included (the interleaved scheduler sends from the last stage to
    the first). Empty for 2 stages (the pipeline group itself is a pair). Sorted, so every rank creates the same
    groups in the same order."""
    n = len(ranks)
    if n <= 2:
        return []
    return sorted({tuple(sorted((ranks[i], ranks[(i + 1) % n]))) for i in range(n)})


def stage_chunks(num_layers: int, pp: int, vpp: int = 1) -> dict[int, list[list[int]]]:
    """Which decoder layers each pipeline stage holds, as PaddleNLP's Qwen2ForCausalLMPipe splits them.

    The pipe is a list of `num_layers + 3` items (embedding, decoders, final norm, LM head) cut by fleet's
    SegmentLayers into `pp * vpp` chunks with equal numbers of decoder layers (PaddleNLP falls back to equal
    numbers of items when `num_layers % pp`); chunk c runs on stage `c % pp`. Returns {stage: [[item indices of
    one chunk], ...]} with item 0 the embedding and item `num_layers + 2` the LM head."""
    from paddle.distributed.fleet.meta_parallel.parallel_layers.pp_layers import SegmentLayers

    items = [type("Qwen2EmbeddingPipe", (), {})] + [type("Qwen2DecoderLayerPipe", (), {})] * num_layers + [
        type("Qwen2RMSNormPipe", (), {}), type("Qwen2LMHeadPipe", (), {})]
    method = "layer:Qwen2DecoderLayer" if num_layers % pp == 0 else "uniform"
    bounds = SegmentLayers(items, num_parts=pp, method=method,
                           num_virtual_pipeline_stage=vpp if vpp > 1 else None).do_segment()
    chunks = {s: [] for s in range(pp)}
    for c in range(len(bounds) - 1):
        chunks[c % pp].append(list(range(bounds[c], bounds[c + 1])))
    return chunks


def expected_owner(name: str, num_layers: int, pp: int, vpp: int = 1) -> int:
    """The pipeline stage that holds the full model's parameter `name` (`qwen2.layers.3.mlp.up_proj.weight`, ...)
    under `stage_chunks`; a tied embedding counts as the first stage's."""
    parts = name.split(".")
    if parts[1:2] == ["embed_tokens"]:
        item = 0
    elif parts[1:2] == ["layers"]:
        item = int(parts[2]) + 1
    elif parts[1:2] == ["norm"]:
        item = num_layers + 1
    else:  # lm_head
        item = num_layers + 2
    return next(s for s, chunks in stage_chunks(num_layers, pp, vpp).items() for c in chunks if item in c)


def merge_owners(per_stage: list[list[str]]) -> dict[str, int]:
    """{name: owning stage} from each stage's list of parameter names (index = stage); a name two stages hold
    (the tied embedding) belongs to the first."""
    owners = {}
    for stage, names in enumerate(per_stage):
        for name in names:
            owners.setdefault(name, stage)
    return owners


class Pipeline:
    """This rank's stage of the policy as PaddleNLP's pipeline model, trained through fleet's 1F1B (or interleaved)
    scheduler; the trainer's full (non-pipeline) copy of the policy generates and scores, and gets the trained
    weights by `copy_to` after every optimizer step."""

    def __init__(self, par: ParallelContext, full_model: Any, virtual_pp_degree: int = 1) -> None:
        from paddle.distributed import fleet
        from paddlenlp.transformers import AutoModelForCausalLMPipe

        self.par = par
        config = full_model.config
        pp = par.pp_world
        if virtual_pp_degree > 1 and config.num_hidden_layers % (pp * virtual_pp_degree):
            raise ConfigError(f"the policy's {config.num_hidden_layers} layers do not split into "
                              f"pipeline_parallel_degree ({pp}) x virtual_pp_degree ({virtual_pp_degree}) chunks")
        config = type(config).from_dict(config.to_dict())
        config.pipeline_parallel_degree = pp
        config.virtual_pp_degree = virtual_pp_degree
        self.layers = AutoModelForCausalLMPipe.from_config(config, dtype="float32")
        own = self.layers.state_dict()
        full = full_model.state_dict()
        self.layers.set_state_dict({k: full[k] for k in own})
        gathered = []
        dist.all_gather_object(gathered, sorted(own), group=par.pp_group)
        self.owners = merge_owners(gathered)
        expected = {k: expected_owner(k, config.num_hidden_layers, pp, virtual_pp_degree) for k in self.owners}
        if expected != self.owners:  # the documented split (stage_chunks, unit-tested) must be fleet's
            raise RuntimeError(f"fleet split the layers differently from stage_chunks: "
                               f"{ {k: v for k, v in self.owners.items() if expected[k] != v} }")
        # A tied embedding lives on the first and the last stage (fleet all-reduces its gradient): in the gradient
        # norm only the first stage's copy counts.
        for comm in getattr(self.layers, "shared_comm", {}).values():
            if par.rank != min(comm["ranks"]):
                for attr in comm["weight_attr"]:
                    getattr(comm["layer"], attr).pipeline_duplicate = True
        self._head = _LastHead.install(self.layers) if self.is_last_stage else None
        self.model = fleet.distributed_model(self.layers)

    def parameters(self) -> list[Any]:
        return self.layers.parameters()

    @property
    def is_last_stage(self) -> bool:
        return self.par.pp_stage == self.par.pp_world - 1

    @property
    def lm_head(self) -> Any:
        """The last stage's LM head layer (PaddleNLP's `Qwen2LMHeadPipe`: `weight` `[H, V]`, or `[V, H]` with
        `transpose_y` when the embeddings are tied), a layer of this stage: its parameters are trained here."""
        if self._head is None:
            raise RuntimeError(f"pipeline stage {self.par.pp_stage} is not the last: it holds no LM head")
        return self._head.head

    def forward_backward(self, inputs: tuple, labels: tuple | None, loss_fn: Callable[..., Any],
                         final_hidden: bool = False) -> None:
        """Forward and backward of one mini-batch split into fleet's micro-batches. `inputs`: the first stage's
        tuple (input_ids, attention_mask, None, position_ids), each [n, S]; `labels`: the last stage's tuple of
        [n, ...] tensors (or None) handed, sliced per micro-batch, to `loss_fn(logits [mb, S, V], labels)`, whose
        loss is backpropagated unscaled. With `final_hidden` the last stage skips its LM head: `loss_fn` gets the
        final hidden states `[mb, S, H]` (after the last norm) and applies `lm_head` itself (the chunked head)."""
        if self._head is not None:
            self._head.final_hidden = final_hidden
        self.layers._loss_fn = [loss_fn]
        # What PipelineParallel._prepare_training does besides taking fleet's optimizer, which this trainer does
        # not use (it sums gradients over data ranks and clips by the global norm itself).
        self.model.set_virtual_pipeline_rank(0)
        self.model.loss_fn_idx = 0
        self.layers.train()
        self.model.forward_backward_pipeline([inputs, labels], None)

    def from_last_stage(self, values: Any) -> np.ndarray:
        """A float64 array computed on the last stage, on every stage."""
        t = paddle.to_tensor(np.asarray(values, dtype=np.float64))
        group = self.par.pp_group
        dist.broadcast(t, src=group.ranks[-1], group=group)
        return t.numpy()

    @paddle.no_grad()
    def copy_to(self, full_model: Any) -> None:
        """Every parameter of `full_model` from the stage that owns it (a broadcast over the pipeline group)."""
        own = self.layers.state_dict()
        group = self.par.pp_group
        stage = self.par.pp_stage
        for name, param in sorted(full_model.state_dict().items()):
            owner = self.owners[name]
            if owner == stage:
                param.set_value(own[name])
            dist.broadcast(param, src=group.ranks[owner], group=group)

    def load_from(self, full_model: Any) -> None:
        """This stage's parameters from `full_model` (after a resume loaded it)."""
        own = self.layers.state_dict()
        full = full_model.state_dict()
        self.layers.set_state_dict({k: full[k] for k in own})


class _LastHead:
    """The last entry of the last stage's run list (fleet's `PipelineLayer.run_function`, or its last model chunk's
    with `virtual_pp_degree`): PaddleNLP's LM head layer, called as before (the logits), or with `final_hidden` its
    input returned unchanged, so that the loss can apply the head a chunk of positions at a time (policy/lm_head.py)
    instead of fleet materialising `[mb, S, V]` logits. Only the call is wrapped: the head stays a registered sublayer
    of the stage (its parameters, state dict and fleet's shared-weight all-reduce are unchanged)."""

    def __init__(self, head: Any) -> None:
        self.head, self.final_hidden = head, False

    def __call__(self, hidden: paddle.Tensor) -> paddle.Tensor:
        return hidden if self.final_hidden else self.head(hidden)

    @classmethod
    def install(cls, layers: Any) -> _LastHead:
        """Wrap the LM head of `layers` (this rank's PipelineLayer, the last stage) in place; the wrapper."""
        chunks = layers.get_model_chunks()  # None without virtual stages
        run = chunks[-1].get_run_function() if chunks else layers.run_function
        if not (isinstance(run[-1], paddle.nn.Layer) and type(run[-1]).__name__.endswith("LMHeadPipe")):
            raise RuntimeError(f"the last stage's last layer is {type(run[-1]).__name__}, not PaddleNLP's LM head "
                               "pipe layer (stage_chunks puts the LM head last)")
        run[-1] = cls(run[-1])
        return run[-1]

