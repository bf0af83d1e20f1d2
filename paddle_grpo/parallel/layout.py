"""Layout decisions that read the config, in the order start-up takes them: which layouts run at all
(`unsupported_layout`, `check_pipeline_config`), fleet's hybrid degrees and strategy (`hybrid_degrees`,
`fleet_strategy`), the data-parallel groups of fleet's topology, and which prompts a data-parallel rank takes
(`prompt_positions`). Following `cfg` through `ParallelContext.from_config` stays in this one module."""
from __future__ import annotations

from typing import Any

from ..config import ConfigError, sharding_options


def hybrid_degrees(cfg: Any, world: int) -> dict[str, int]:
    """fleet's hybrid degrees for `world` processes: {"dp_degree", "mp_degree", "pp_degree", "sharding_degree"}.

    The ranks that hold the same model shard (world / (tp * pp) of them) are fleet's data axis times its sharding
    axis; `sharding_parallel_degree` (-1: all of them) sets the sharding part when `sharding` is on."""
    tp, pp = cfg.tensor_parallel_degree, cfg.pipeline_parallel_degree
    cfg.batch_geometry(world)  # raises ConfigError naming the keys when the degrees do not split the processes
    data_ranks = world // (tp * pp)
    sharding = 1
    if cfg.sharding:
        sharding = data_ranks if cfg.sharding_parallel_degree <= 0 else cfg.sharding_parallel_degree
    return {"dp_degree": data_ranks // sharding, "mp_degree": tp, "pp_degree": pp, "sharding_degree": sharding}


def unsupported_layout(cfg: Any) -> list[str]:
    """What of the configured parallel layout this version cannot run, one message per key (empty: all of it).
    sharding: stage2 runs as stage1 (config.inert_key_messages warns): fleet's group_sharded_parallel runs only on
    GPU/XPU and could not be tested here."""
    checks = (
        ("pipeline_parallel_degree", cfg.pipeline_parallel_degree if cfg.sharding else 1,
         f"together with sharding: {cfg.sharding!r}; set sharding: '' for pipeline parallelism, or "
         "pipeline_parallel_degree: 1 for sharding"),
        ("sharding_parallel_config", "split_param" if "split_param" in sharding_options(cfg) else "",
         "sharding V2 keeps gradients in main_grad, which the trainer's gradient path does not read"))
    return [f"{key}: {value!r} is not supported by this version of paddle_grpo ({why})"
            for key, value, why in checks if value not in (1, "")]


def check_pipeline_config(cfg: Any, world: int | None = None) -> None:
    """Fail at start-up, naming the keys, on pipeline layouts this trainer or fleet cannot run. `world`: the
    launch's processes (None: ask paddle; 1 in a single process)."""
    pp, vpp = cfg.pipeline_parallel_degree, cfg.virtual_pp_degree
    if vpp > 1 and pp < 3:
        raise ConfigError(f"virtual_pp_degree ({vpp}) > 1 needs pipeline_parallel_degree >= 3 (fleet's interleaved "
                          f"scheduler); pipeline_parallel_degree is {pp}")
    if pp == 1:
        return
    if cfg.tensor_parallel_degree > 1:
        raise NotImplementedError(f"tensor_parallel_degree ({cfg.tensor_parallel_degree}) together with "
                                  f"pipeline_parallel_degree ({pp}) is not supported; use one of them")
    if cfg.lora:
        raise NotImplementedError(f"lora: true with pipeline_parallel_degree ({pp}) is not supported")
    if vpp > 1:
        if world is None:
            import paddle.distributed as dist

            world = dist.get_world_size()
        geo = cfg.batch_geometry(max(world, cfg.tensor_parallel_degree * pp))
        if geo.grad_accum_steps < pp:
            raise ConfigError(
                f"virtual_pp_degree ({vpp}) needs at least pipeline_parallel_degree ({pp}) micro-batches per "
                f"optimizer step; global_mini_batch_size / data-parallel degree x rollout_n / "
                f"per_device_train_batch_size ({cfg.per_device_train_batch_size}) gives {geo.grad_accum_steps}")


def fleet_strategy(cfg: Any, world: int, cpu: bool) -> Any:
    """fleet's `DistributedStrategy` for this layout: the hybrid degrees and, with pipeline stages, how the
    pipeline scheduler splits and scales a mini-batch."""
    from paddle.distributed import fleet

    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = dict(hybrid_degrees(cfg, world))
    if cfg.pipeline_parallel_degree > 1:
        geo = cfg.batch_geometry(world)
        # One pipeline call per mini-batch: its micro-batches are the trainer's micro-batches.
        strategy.pipeline_configs = {"accumulate_steps": geo.grad_accum_steps,
                                     "micro_batch_size": cfg.per_device_train_batch_size}
        pp_configs = strategy.hybrid_configs["pp_configs"]
        # The loss is already this micro-batch's share of the mini-batch loss (global denominators): fleet must not
        # divide it by accumulate_steps. With delay_scale_loss fleet would instead scale the gradients in
        # _optimizer_step, which the trainer never calls (it steps its own optimizer after summing over DP ranks).
        pp_configs.delay_scale_loss = True
        # Sequence lengths change every mini-batch: p2p shape metadata must not be reused across calls.
        pp_configs.clear_every_step_cache = True
        if cpu:
            pp_configs.use_batch_p2p_comm = False  # batched isend/irecv need the calc stream gloo lacks
    return strategy


def data_parallel_groups(topology: Any) -> list[list[int]]:
    """Rank lists of the data-parallel groups of a fleet `CommunicateTopology`: ranks that differ only in their
    data and sharding coordinates (they hold the same model shard and see different prompts), each sorted."""
    names = topology.get_hybrid_group_names()
    groups = {}
    for r in range(topology.world_size()):
        coord = topology.get_coord(r)
        key = tuple(c for name, c in zip(names, coord) if name not in ("data", "sharding"))
        groups.setdefault(key, []).append(r)
    return sorted(groups.values())


def prompt_positions(n: int, world: int, rank: int, mini_batch: int) -> list[int]:
    """Which of a step's `n` prompts (positions in the sampled batch) data-parallel rank `rank` of `world` takes.

    Each global mini-batch of `mini_batch` prompts is split evenly over the ranks, so a rank's k-th local
    mini-batch is its share of global mini-batch k, and N ranks update on exactly the mini-batches one process does
    (a plain contiguous split would hand rank r the r-th block of prompts, mixing global mini-batches). Falls back
    to the contiguous split when `n` is not a whole number of such mini-batches (dynamic sampling's larger
    generation batch)."""
    if n % mini_batch or mini_batch % world:
        per_rank = n // world
        return list(range(rank * per_rank, (rank + 1) * per_rank))
    share = mini_batch // world
    return [start + rank * share + i for start in range(0, n, mini_batch) for i in range(share)]
