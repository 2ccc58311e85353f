"""Batch export on Ray: an ExportPlan's pending lines, in shards, through the one runner on a pool of actors.

Each actor loads its own Chat from the model folder and runs export.runner.run_shard on the shards it is handed;
the driver stores every returned line (export.local.store: the WAV, its sidecar, digest, journal) and writes
manifest.json, so the output is the same as a local export's and actors may run on any node. Needs the [ray]
extra; `ray` is imported inside functions so init_ray() can set the loopback environment first.
"""
from __future__ import annotations

import os
import socket
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tqdm import tqdm

from ..cluster import init_ray, load_worker_chat
from ..engine.progress import progress_bar
from ..params import InferCodeParams
from .local import report_done, report_plan, store
from .manifest import now
from .plan import ExportPlan
from .runner import LineResult, Log, Shard, run_shard, shards_of

if TYPE_CHECKING:
    from ray.actor import ActorHandle


@dataclass
class RayExportOptions:
    """The actor pool: `actors` engines, each handed up to `batches_in_flight` shards of `batch_size` lines."""

    actors: int = 2
    cpus_per_actor: float = 0.5  # keep actors x cpus below the cluster's CPUs, or the actors wait forever
    gpus_per_actor: float = 0.0
    batch_size: int = 64  # lines per shard: one job of shape "each", so the engine batches them all (max_num_seqs)
    batches_in_flight: int = 2  # shards queued per actor, so it starts the next as soon as one returns
    start_timeout_s: int = 600  # every actor must have loaded its model by then; raises if the cluster cannot
    #                             place them (too few CPUs or GPUs)

    def __post_init__(self) -> None:
        for name in ("actors", "batch_size", "batches_in_flight", "start_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        if self.cpus_per_actor < 0 or self.gpus_per_actor < 0:
            raise ValueError("cpus_per_actor / gpus_per_actor: must be >= 0")

    def shard_size(self, lines: int) -> int:
        """Lines per shard for a job of `lines`: batch_size, or fewer so that every actor gets a shard."""
        return max(1, min(self.batch_size, lines // self.actors))


class ShardWorker:
    """One actor: a Chat loaded from the model folder, running the export's runner on each shard it is handed."""

    def __init__(self, model_dir: str, load_kwargs: dict[str, Any]) -> None:
        self.chat = load_worker_chat(model_dir, **load_kwargs)

    def name(self) -> str:
        return f"{socket.gethostname()}/{os.getpid()}"

    def run(self, shard: Shard) -> list[LineResult]:
        results: list[LineResult] = []
        run_shard(self.chat.pipeline, shard, results.append, print)
        return results


def run_export_ray(model_dir: str | Path, plan: ExportPlan, params: InferCodeParams | None = None,
                   options: RayExportOptions | None = None, progress: bool = True, log: Log = tqdm.write,
                   **load_kwargs: Any) -> ExportPlan:
    """export.run_export on Ray: the same statuses, files and manifest, with the synthesis on an actor pool.

    Runs on the cluster init_ray() joined (a private loopback one if none). `params` is every line's
    template (spk_emb and manual_seed are set per line); load_kwargs go to Chat.load on each actor
    (verify, dtype, EngineConfig fields such as kv_cache_memory).
    """
    params = params or InferCodeParams(show_tqdm=False)
    options = options or RayExportOptions()
    model_dir = str(Path(model_dir).resolve())
    report_plan(plan, log)
    plan.meta.update(model=model_dir, precision=load_kwargs.get("dtype", "float32"), started=now())
    shards = shards_of(plan, params, options.shard_size(len(plan.todo)))
    try:
        if shards:
            _run_on_actors(model_dir, plan, shards, options, load_kwargs, progress, log)
    finally:
        for line in plan.todo:  # never silently lost: no result came back for it (the run stopped early)
            line.status, line.error = "error", "no result: the Ray run stopped before this line ran; run again"
        plan.save()
        plan.release()
    report_done(plan, log)
    return plan


def _run_on_actors(model_dir: str, plan: ExportPlan, shards: list[Shard], options: RayExportOptions,
                   load_kwargs: dict[str, Any], progress: bool, log: Log) -> None:
    init_ray()  # a no-op on a connected driver; never let Ray auto-start a cluster on the network address
    import ray

    actors = start_actors(model_dir, min(options.actors, len(shards)), options, load_kwargs)
    lines = {name: 0 for name in actors}
    try:
        with progress_bar(len(plan.todo), "export (ray)", "line", enabled=progress, leave=True) as bar:
            for name, results in dispatch(actors, shards, options.batches_in_flight):
                for result in results:
                    store(plan, result, log)
                    bar.update(1)
                lines[name] += len(results)
    finally:
        for actor in actors.values():
            ray.kill(actor)
    log(f"ray: {len(actors)} actor(s) ran {sorted(lines.values())} lines in {len(shards)} shard(s)")


def start_actors(model_dir: str, count: int, options: RayExportOptions,
                 load_kwargs: dict[str, Any]) -> dict[str, ActorHandle[ShardWorker]]:
    """name -> actor handle, once every actor has loaded its model (ValueError if they cannot be placed in time)."""
    import ray

    gpus = {"num_gpus": options.gpus_per_actor} if options.gpus_per_actor else {}
    # A dead actor process is restarted (loading the model again) and its shard run again.
    worker = ray.remote(max_restarts=1, max_task_retries=1)(ShardWorker)
    # Ray types an actor class's remote() as "the handle or the class"; it returns the handle
    actors = [cast("ActorHandle[ShardWorker]",
                   worker.options(num_cpus=options.cpus_per_actor, **gpus).remote(model_dir, load_kwargs))
              for _ in range(count)]
    try:
        names = ray.get([actor.name.remote() for actor in actors], timeout=options.start_timeout_s)
    except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as exc:
        for actor in actors:
            ray.kill(actor)
        if isinstance(exc, ray.exceptions.RayActorError):  # its constructor raised: Chat.load's own message
            raise ValueError(f"model_dir: an actor could not load {model_dir}: {_cause(exc)}") from None
        raise ValueError(f"actors: {count} actor(s) of {options.cpus_per_actor} CPU and {options.gpus_per_actor} "
                         f"GPU did not start in {options.start_timeout_s} s; ask for fewer or smaller actors") from None
    return dict(zip(names, actors, strict=True))


def _cause(exc: Exception) -> str:
    """The last line of the error an actor died of (Ray wraps it in its own report)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def dispatch(actors: dict[str, ActorHandle[ShardWorker]], shards: list[Shard],
             in_flight: int) -> Iterator[tuple[str, list[LineResult]]]:
    """(actor name, its results) per shard as shards finish; each actor holds up to `in_flight` shards at once.

    A shard whose actor failed for good comes back as an error on each of its lines, and that actor gets no more;
    shards no actor is left to run are not yielded (the caller finds their lines still pending).
    """
    import ray

    queue, running, lost = deque(shards), {}, set()

    def hand(name: str) -> None:
        if queue and name not in lost:
            shard = queue.popleft()
            running[actors[name].run.remote(shard)] = (name, shard)

    for _ in range(in_flight):  # one shard each first, so every actor starts at once
        for name in actors:
            hand(name)
    while running:
        (ref,), _ = ray.wait(list(running), num_returns=1)
        name, shard = running.pop(ref)
        try:
            results = ray.get(ref)
        except ray.exceptions.RayError as exc:
            if isinstance(exc, ray.exceptions.RayActorError):
                lost.add(name)
            reason = f"synthesis failed: the Ray task failed ({type(exc).__name__}: {exc}); run again"
            results = [LineResult(line.key, error=reason) for line in shard.lines]
        yield name, results
        hand(name)
