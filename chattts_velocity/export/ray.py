"""Batch export on Ray Data: an ExportPlan's pending lines -> an actor pool (one engine per actor) -> WAV bytes.

In: export.plan_export's plan and a model folder. Out: the same plan, statuses filled in; the driver writes every
WAV (atomically) and manifest.json, so actors may run on any node. Resuming works as for the local export.
"""
from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ..audio.encode import wav_bytes
from ..audio.wav import SAMPLE_RATE
from ..engine.async_engine import AsyncLLMEngine
from ..engine.progress import progress_bar
from ..params import InferCodeParams
from ..serve.ray_serve import init_ray, load_worker_chat
from ..speech.service import SpeechService
from .plan import ExportLine, ExportPlan
from .manifest import file_digest, now, replace_atomically
from .run import Log, report_done, report_plan

NO_AUDIO = "the model produced no audio (it stopped at the first step); try another seed"


@dataclass
class RayExportOptions:
    """The actor pool. The engine sees up to actors x batches_in_flight x 4 x batch_size rows at once
    (Ray Data also runs 4 batches of one task concurrently in an async UDF)."""

    actors: int = 2
    cpus_per_actor: float = 0.5  # keep actors x cpus below the cluster's CPUs, or Ray Data stalls (ray#44687)
    gpus_per_actor: float = 0.0
    batch_size: int = 16
    batches_in_flight: int = 4  # concurrent UDF calls per actor, all feeding the one engine
    manifest_every: int = 64  # rows written between manifest rewrites
    start_timeout_s: int = 600  # wait for every actor to load before dispatching, so the first one ready
    #                             does not take all the work; raises if the cluster cannot place them

    def __post_init__(self) -> None:
        for name in ("actors", "batch_size", "batches_in_flight", "manifest_every", "start_timeout_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)!r}")
        if self.cpus_per_actor < 0 or self.gpus_per_actor < 0:
            raise ValueError("cpus_per_actor / gpus_per_actor: must be >= 0")


class Synthesizer:
    """Ray Data UDF, one per actor: a Chat and its AsyncLLMEngine; every row of every batch in flight joins
    the engine's running batch. A row's failure becomes its status/error, never the block's."""

    def __init__(self, model_dir: str, params: InferCodeParams, load_kwargs: dict[str, Any]) -> None:
        self.model_dir, self.params, self.load_kwargs = model_dir, params, load_kwargs
        self._start()

    def _start(self) -> None:
        chat = load_worker_chat(self.model_dir, **self.load_kwargs)
        self.engine = AsyncLLMEngine(chat.engine())
        self.service = SpeechService(chat.pipeline, self.engine)
        self.engine.start()

    async def __call__(self, batch: dict[str, np.ndarray]) -> AsyncIterator[dict[str, list]]:
        engine = self.engine
        rows = await asyncio.gather(*(self._row(str(text), int(seed), str(speaker)) for text, seed, speaker
                                      in zip(batch["text"], batch["seed"], batch["speaker"], strict=True)))
        if engine is self.engine and not engine.is_running:
            # The loop died (its rows carry the error); a fresh engine serves the next batches.
            self.service.shutdown()
            self._start()
        worker, peak = f"{socket.gethostname()}/{os.getpid()}", engine.stats.max_batch_size
        yield {"key": list(batch["key"]), "wav": [r[0] for r in rows], "samples": [r[1] for r in rows],
               "status": [r[2] for r in rows], "error": [r[3] for r in rows],
               "worker": [worker] * len(rows), "engine_peak": [peak] * len(rows)}

    async def _row(self, text: str, seed: int, speaker: str) -> tuple[bytes, int, str, str]:
        params = dataclasses.replace(self.params, spk_emb=speaker or None, manual_seed=seed)
        try:
            wav = await self.service.synthesize(text, params)
        except Exception as exc:  # noqa: BLE001 -- reported in the row; the block goes on
            return b"", 0, "error", f"synthesis failed: {type(exc).__name__}: {exc}"
        if len(wav) == 0:
            return b"", 0, "error", NO_AUDIO
        return wav_bytes(wav), len(wav), "ok", ""


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
    report_plan(plan, log)
    plan.meta.update(model=str(Path(model_dir).resolve()), precision=load_kwargs.get("dtype", "float32"), started=now())
    keys = [k for k, line in enumerate(plan.lines) if line.status == "pending"]
    try:
        if keys:
            dataset = export_dataset(str(Path(model_dir).resolve()), plan, keys, params, options, load_kwargs)
            _collect(plan, dataset, len(keys), options.manifest_every, progress, log)
    finally:
        for line in plan.todo:  # never silently lost: Ray returned no row for it (job stopped early)
            line.status, line.error = "error", "no result: the Ray job stopped before this line ran; run again"
        plan.save()
        plan.release()
    report_done(plan, log)
    return plan


def export_dataset(model_dir: str, plan: ExportPlan, keys: list[int], params: InferCodeParams,
                   options: RayExportOptions, load_kwargs: dict[str, Any]):
    """The lazy Dataset: one row per pending line (key = index in plan.lines) -> key, wav, samples, status, error."""
    init_ray()  # a no-op on a connected driver; never let Ray Data auto-start a cluster on the network address
    import ray

    rows = [{"key": k, "text": plan.lines[k].text, "seed": plan.lines[k].seed, "speaker": plan.lines[k].speaker or ""}
            for k in keys]
    batch_size, blocks = spread(len(rows), options)
    dataset = ray.data.from_items(rows, override_num_blocks=blocks)
    pool = ray.data.ActorPoolStrategy(size=min(options.actors, blocks),
                                      max_tasks_in_flight_per_actor=options.batches_in_flight,
                                      max_concurrent_calls_per_actor=options.batches_in_flight)
    gpus = {"num_gpus": options.gpus_per_actor} if options.gpus_per_actor else {}
    dataset.context.wait_for_min_actors_s = options.start_timeout_s
    return dataset.map_batches(Synthesizer, fn_constructor_args=(model_dir, params, load_kwargs),
                               batch_size=batch_size, batch_format="numpy", compute=pool,
                               num_cpus=options.cpus_per_actor, **gpus)


def spread(num_rows: int, options: RayExportOptions) -> tuple[int, int]:
    """(batch size, blocks) for num_rows lines: at least actors x batches_in_flight blocks, so every actor gets work.

    Ray Data bundles blocks until a bundle holds batch_size rows, and a bundle is one task on one actor: 30 lines
    in 2 blocks of 15 with batch_size 16 made one task, so one actor ran them all while the other idled. A batch of
    at most num_rows / (actors x batches_in_flight) rows keeps every actor's batches in flight busy.
    """
    slots = options.actors * options.batches_in_flight
    batch_size = max(1, min(options.batch_size, math.ceil(num_rows / slots)))
    return batch_size, math.ceil(num_rows / batch_size)


def _collect(plan: ExportPlan, dataset, total: int, manifest_every: int, progress: bool, log: Log) -> None:
    workers: dict[str, int] = {}
    peak = 0
    with progress_bar(total, "export (ray)", "line", enabled=progress, leave=True) as bar:
        for n, row in enumerate(dataset.iter_rows(), start=1):
            store_row(plan, plan.lines[int(row["key"])], row, log)
            workers[row["worker"]] = workers.get(row["worker"], 0) + 1
            peak = max(peak, int(row["engine_peak"]))
            bar.update(1)
            if n % manifest_every == 0:
                plan.save()
    log(f"ray: {len(workers)} actor(s) ran {sorted(workers.values())} lines; engine batches reached {peak} sequences")


def store_row(plan: ExportPlan, line: ExportLine, row: dict[str, Any], log: Log) -> None:
    """Write one returned row's WAV (atomically) and record its status on the line."""
    if row["status"] != "ok":
        line.status, line.error = "error", str(row["error"])
        log(f"line {line.line}: {line.error}")
        return
    data = bytes(row["wav"])
    try:
        replace_atomically(plan.out_dir / line.output, lambda tmp: tmp.write_bytes(data))
    except OSError as exc:  # a full disk or a blocked path fails this line only
        line.status, line.error = "error", f"could not write {line.output}: {exc}"
        log(f"line {line.line}: {line.error}")
        return
    line.status, line.error = "ok", None
    line.duration = round(int(row["samples"]) / SAMPLE_RATE, 3)
    line.audio = file_digest(plan.out_dir / line.output)
    plan.journal(line)
