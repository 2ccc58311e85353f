"""Host cost of the engine's step loop: scheduling, metadata, sampler preparation, output handling; no model work.

The engine runs a real backend ("triton" under TRITON_INTERPRET=1, or "cpu") whose kernels are replaced by
ready-made results: the layers return their input (hidden states of the right shape), the heads return fixed
logits, the sampler's draw returns fixed tokens (its host-side preparation still runs); on the triton backend a steady
decode step's graph (worker/backends/step_graph.py: slots, embedding, layers, heads, sampler; one replay on a GPU)
returns fixed tokens, while filling its buffers and staging its per-step inputs still run; steady steps run a step
ahead of the host (EngineConfig.overlap), as on a GPU. A step is timed with its consumer's part: the collectors
LLM.generate keeps (engine/collect.py) take the step's outputs. What is left is the host work of a step. Reported, in
milliseconds of the host thread's CPU time per step (median; torch runs one thread, so a busy host's other processes
inflate it far less than wall time):

- decode_host_ms[N]: a decode step of N running sequences at context ~300 (decode_host_ms_mean[N]: the mean of the
  same steps, the occasional slow step included; --parts adds decode_parts_ms[N], the mean per part of the step);
- admit_host_ms[P]: what admitting one P-row prompt among 63 running costs beyond decode steps of 63 (the steps
  until it runs: with the triton backend's overlapped loop, the one that drains the step in flight, then its own);
- launches_per_step[N] (the last tree only): the kernels one steady decode step of N sequences launches on a GPU, the
  captured graph's and the eager ones (chattts_velocity/devtools/launch_counter.py: Triton launches and aten ops
  that run a kernel), counted with the triton backend under the interpreter at ChatTTS's depth (20 layers, a small
  width; Triton kernels counted, not run);
- cuda_calls_per_step[N] (the last tree only): the CUDA API calls a steady step of the overlapped loop makes on a
  GPU, by kind (graph replays, host-to-device and device-to-host copies, event records and synchronizes, launches
  outside the graph, allocations) and their total (chattts_velocity/devtools/cuda_calls.py, counted the same way).

    python -m benchmarks.bench_host                          # this tree, triton backend
    python -m benchmarks.bench_host --trees OLD_CHECKOUT .   # two trees in one run, interleaved
    python -m benchmarks.bench_host --json                   # one line: this tree's numbers

--model-work keeps the model (20 layers, cpu backend): the same loop as a CPU speed A/B of the two trees.
Each (tree, backend) is a fresh process with the tree first on its path; trees alternate per round (tree_ab.py's
interleaved, the harness every tree comparison shares). Writes
results/host_<backend>.json with every tree's rounds and medians.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.lib.ab import interleaved

REPO = Path(__file__).resolve().parents[1]
CONTEXT, RUNNING, DECODE_SIZES, PROMPTS = 300, 63, (1, 64, 256), (200, 2048)

CHILD = r"""
import ctypes, gc, json, statistics, sys, time
import torch
torch.set_num_threads(1)
# The triton backend's device memory is host memory here. A GPU's caching allocator hands out memory that costs the
# host nothing; host memory freshly taken from the OS page-faults on its first write (at 256 sequences ~190 faults,
# ~0.4 ms, a step for the hidden-state log's new rows). So allocations stay on a heap touched once in advance.
libc = ctypes.CDLL("libc.so.6")
libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD: allocations of up to 1 GiB come from the heap
libc.mallopt(-1, 1 << 31)  # M_TRIM_THRESHOLD: freed heap memory is kept, not given back to the OS
touched = torch.ones(768 << 20, dtype=torch.uint8)
del touched
from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.engine.llm_engine import LLMEngine
from chattts_velocity.model import ChatTTSLlama, Embed, kv_cache_bytes_per_block
from chattts_velocity.schema import Prompt, SamplingParams

backend, steps = sys.argv[2], int(sys.argv[3])
CONTEXT, RUNNING = int(sys.argv[4]), int(sys.argv[5])
sizes, prompts, model_work = json.loads(sys.argv[6]), json.loads(sys.argv[7]), sys.argv[8] == "1"
# ChatTTS's widths (head_dim 64, as the cpu backend's kernels need); with no model work 2 layers (the host work does
# not depend on the depth, and the KV pool stays small), with it all 20
cfg = ModelConfig(num_hidden_layers=20 if model_work else 2)
positions = max(sizes) * (CONTEXT + steps + 16) + max(prompts) + 4096  # + one full-length sequence
pool = -(-positions // 16) * kv_cache_bytes_per_block(cfg.num_hidden_layers, 16, cfg.num_attention_heads, cfg.head_dim,
                                                     torch.bfloat16)
# the step loop a GPU runs: steady steps a step ahead of the host on the triton backend (where the tree has it)
ahead = {"overlap": True} if backend == "triton" and "overlap" in EngineConfig.__dataclass_fields__ else {}
engine_config = EngineConfig.from_kwargs(backend=backend, dtype="bfloat16", max_num_seqs=max(sizes),
                                         max_num_batched_tokens=4096, max_model_len=4096, kv_cache_memory=pool,
                                         **ahead)
model = ChatTTSLlama(cfg)
for weight in model.parameters():  # weights in bf16, RoPE tables (buffers) stay fp32, as load_gpt leaves them
    weight.data = weight.data.to(torch.bfloat16)
embed = Embed(cfg.hidden_size, cfg.num_audio_tokens, cfg.num_text_tokens, cfg.num_vq)
engine = LLMEngine(model, embed, cfg, engine_config)
runner = engine.runner
assert runner.backend.name == backend, runner.backend.name
ready_code = torch.zeros(max(sizes) + 1, cfg.num_vq, cfg.num_audio_tokens)
ready_tokens = torch.zeros(max(sizes) + 1, cfg.num_vq, dtype=torch.int64)
# no model work: the layers return their input, the heads fixed logits, the draw fixed tokens
if backend == "cpu" and not model_work:
    runner.backend.fused = lambda embeds, *args: embeds
elif not model_work:
    runner.backend.layers = lambda x, *args: x
ready_hidden = torch.zeros(max(sizes) + 1, cfg.hidden_size)
if not model_work:
    runner.embed.logits_rowwise = lambda hidden, name: ready_code[: hidden.shape[0]]
    sampler = getattr(runner.backend, "sampler", None) or runner.sampler
    sampler.sample = lambda logits, batch: ready_tokens[: len(batch.noise_seeds)]
    graphs = getattr(runner, "step_graphs", None)
    if graphs is not None:  # a steady step is one graph replay on a GPU: its body is model work, filling it is not
        graphs.fn = lambda inputs: (ready_tokens[: inputs.ids.shape[0]], ready_hidden[: inputs.ids.shape[0]])
clock = time.process_time if model_work else time.thread_time
gen = torch.Generator().manual_seed(0)
# the consumer LLM.generate puts on every step: its collectors take the step's outputs (where the tree has them, as
# one block; else one delta per request)
try:
    from chattts_velocity.engine.collect import Collectors
    consumer = Collectors()
    def consume():
        consumer.take(engine.step_deltas())
except ImportError:
    from chattts_velocity.engine.llm import _Collector
    collected = {}
    class Consumer:
        def add(self, rid, hidden_size):
            collected[rid] = _Collector(rid, hidden_size)
        def take(self, deltas):
            for delta in deltas:
                collector = collected.get(delta.request_id)
                if collector is not None:
                    collector.add(delta)
    consumer = Consumer()
    def consume():
        consumer.take(engine.step())

def prompt(rows):
    ids = torch.randint(0, cfg.num_audio_tokens - 1, (rows, cfg.num_vq), generator=gen)
    return Prompt(ids, torch.zeros(rows, dtype=torch.bool))

def params():
    return SamplingParams(mode="code", max_new_token=1000, min_new_token=1000, eos_token_id=cfg.num_audio_tokens - 1)

def timed_step():
    # CPU time of this thread (torch runs single-threaded here): what a busy host's other processes do not inflate
    t = clock()
    consume()
    return clock() - t

def add(rows):
    rid = engine.add_request(None, prompt(rows), params())
    consumer.add(rid, cfg.hidden_size)
    return rid

def fill(n):
    for _ in range(n):
        add(CONTEXT)
    while engine.scheduler.waiting or any(s.num_computed_tokens < len(s) - 1 for s in engine.scheduler.running):
        consume()
    assert len(engine.scheduler.running) == n, "a step failed: the bench would time nothing"

def clear():
    for seq in list(engine.scheduler.running):
        engine.abort_request(seq.request_id)

parts = {}  # with --parts: the step's parts, CPU time summed over the timed steps

def time_part(owner, name):
    run = getattr(owner, name, None)
    if run is None:  # an older tree without this part
        return
    def timed(*args, **kwargs):
        t = clock()
        try:
            return run(*args, **kwargs)
        finally:
            parts[name] = parts.get(name, 0.0) + clock() - t
    setattr(owner, name, timed)

if sys.argv[9] == "1":
    for owner, names in ((engine.scheduler, ("schedule_ahead", "postprocess")), (runner, ("launch", "collect")),
                         (engine, ("_deltas", "_finish")), (getattr(runner, "step_graphs", None), ("_fill_step",)),
                         (consumer, ("take",))):
        for name in names:
            time_part(owner, name)

out = {"decode_host_ms": {}, "admit_host_ms": {}, "decode_host_ms_mean": {}, "decode_parts_ms": {}}
gc.collect()
gc.freeze()  # as the server does once it is up (serve/openai_api.py): full passes skip the startup heap
for n in sizes:
    fill(n)
    for _ in range(3):
        consume()
    parts.clear()
    times = [timed_step() for _ in range(steps)]
    out["decode_host_ms"][str(n)] = 1e3 * statistics.median(times)
    out["decode_host_ms_mean"][str(n)] = 1e3 * statistics.mean(times)  # the GPU waits for the mean, spikes included
    out["decode_parts_ms"][str(n)] = {k: round(1e3 * v / steps, 4) for k, v in parts.items()}
    clear()
fill(RUNNING)
for _ in range(3):
    consume()
base = statistics.median(timed_step() for _ in range(steps))
for rows in prompts:
    extra = []
    for _ in range(5):
        rid = add(rows)
        spent = timed_step() - base
        while engine.scheduler.waiting:  # a step in flight is read first (overlapped loop): then the admission
            spent += timed_step() - base
        extra.append(spent)
        engine.abort_request(rid)
        consume()
    out["admit_host_ms"][str(rows)] = 1e3 * statistics.median(extra)
out["decode_host_ms_63"] = 1e3 * base
print(json.dumps(out))
"""


LAUNCHES = r"""
import json, sys
import torch
torch.set_num_threads(1)
from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.devtools.launch_counter import LaunchCounter
from chattts_velocity.engine.llm_engine import LLMEngine
from chattts_velocity.model import ChatTTSLlama, Embed
from chattts_velocity.schema import Prompt, SamplingParams

# ChatTTS's depth (20 layers) and head_dim (64) at a small width: launches do not depend on the width, nor on the
# dtype (bf16 weights launch what float32 weights launch: tests/engine/test_launches.py)
cfg = ModelConfig(hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=2,
                  num_hidden_layers=20, max_position_embeddings=512)
out = {}
for n in json.loads(sys.argv[2]):
    engine = LLMEngine(ChatTTSLlama(cfg), Embed(cfg.hidden_size, cfg.num_audio_tokens, cfg.num_text_tokens, cfg.num_vq),
                       cfg, EngineConfig.from_kwargs(backend="triton", dtype="float32", max_num_seqs=n,
                                                max_model_len=64, kv_cache_memory=1 << 26))
    for i in range(n):
        ids = torch.full((4, cfg.num_vq), i % 500)
        engine.add_request(None, Prompt(ids, torch.ones(4, dtype=torch.bool)),
                           SamplingParams(max_new_token=8, min_new_token=8, seed=i))
    # Triton kernels are counted but not run (the interpreter is slow), before the counted step too: the values
    # are then meaningless, the launches are the same
    with LaunchCounter(skip_kernels=True):
        for _ in range(2):
            engine.step()
    steady = engine.stats.num_steady_steps
    with LaunchCounter(skip_kernels=True) as launches:
        engine.step()
    assert engine.stats.num_steady_steps == steady + 1, "the counted step was not a steady decode step"
    out[str(n)] = {"count": launches.count, "triton": launches.triton, "ops": dict(launches.ops)}
print(json.dumps(out))
"""


CUDA_CALLS = r"""
import json, sys
import torch
torch.set_num_threads(1)
from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.devtools.cuda_calls import CudaCalls
from chattts_velocity.devtools.launch_counter import LaunchCounter
from chattts_velocity.engine.llm_engine import LLMEngine
from chattts_velocity.model import ChatTTSLlama, Embed
from chattts_velocity.schema import Prompt, SamplingParams

# the loop a GPU runs: steady steps a step ahead of the host (overlap on), 2 layers (the calls do not depend on depth)
cfg = ModelConfig(hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=2,
                  num_hidden_layers=2, max_position_embeddings=512)
out = {}
for n in json.loads(sys.argv[2]):
    engine = LLMEngine(ChatTTSLlama(cfg), Embed(cfg.hidden_size, cfg.num_audio_tokens, cfg.num_text_tokens, cfg.num_vq),
                       cfg, EngineConfig.from_kwargs(backend="triton", dtype="float32", max_num_seqs=n,
                                                     max_model_len=64, kv_cache_memory=1 << 26, overlap=True))
    for i in range(n):
        engine.add_request(None, Prompt(torch.full((4, cfg.num_vq), i % 500), torch.ones(4, dtype=torch.bool)),
                           SamplingParams(max_new_token=9, min_new_token=9, seed=i))
    with LaunchCounter(skip_kernels=True):
        for _ in range(3):
            engine.step()
    steady = engine.stats.num_steady_steps
    with CudaCalls(skip_kernels=True) as calls:
        engine.step()
    assert engine.stats.num_steady_steps == steady + 1, "the counted step was not a steady decode step"
    out[str(n)] = dict(calls.counts, total=calls.total)
print(json.dumps(out))
"""


def count_cuda_calls(tree: Path, sizes: tuple[int, ...] = (1, 64)) -> dict:
    """The CUDA API calls of one steady decode step (overlapped loop) under the interpreter, by kind; {} for a tree
    without devtools/cuda_calls.py."""
    if not (tree / "chattts_velocity" / "devtools" / "cuda_calls.py").is_file():
        return {}
    env = {**os.environ, "PYTHONPATH": str(tree), "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", CUDA_CALLS, str(tree), json.dumps(sizes)], capture_output=True,
                          text=True, timeout=1800, env=env, cwd=str(tree))
    if done.returncode != 0:
        raise RuntimeError(f"bench_host CUDA call count failed for {tree}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def count_launches(tree: Path, sizes: tuple[int, ...] = (1, 64)) -> dict:
    """Launches of one steady decode step of the triton backend under the interpreter: per batch size, the count,
    its Triton kernels and every op by name (results file only)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", LAUNCHES, str(tree), json.dumps(sizes)], capture_output=True,
                          text=True, timeout=1800, env=env, cwd=str(tree))
    if done.returncode != 0:
        raise RuntimeError(f"bench_host launch count failed for {tree}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(tree: Path, backend: str, steps: int, model_work: bool, parts: bool = False) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "TRITON_INTERPRET": "1"}
    sizes, prompts, running = ((1, 16), (200,), 15) if model_work else (DECODE_SIZES, PROMPTS, RUNNING)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tree), backend, str(steps), str(CONTEXT), str(running),
         json.dumps(sizes), json.dumps(prompts), "1" if model_work else "0", "1" if parts else "0"],
        capture_output=True, text=True, timeout=1800, env=env, cwd=str(tree))
    if done.returncode != 0:
        raise RuntimeError(f"bench_host child failed for {tree} ({backend}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def medians(rounds: list[dict]) -> dict:
    """The one-line JSON shape (--json): per key, the median over rounds."""
    return {key: {k: round(statistics.median(r[key][k] for r in rounds), 4) for k in rounds[0][key]}
            for key in ("decode_host_ms", "admit_host_ms", "decode_host_ms_mean") if key in rounds[0]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", default=[str(REPO)], help="checkouts of this repository (last = new)")
    parser.add_argument("--backend", default="triton", choices=["triton", "cpu"])
    parser.add_argument("--steps", type=int, default=30, help="timed decode steps per size")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds per tree (benchmarks/lib/ab.py)")
    parser.add_argument("--json", action="store_true", help="print only the last tree's one-line JSON")
    parser.add_argument("--model-work", action="store_true",
                        help="keep the model work (all 20 layers, heads, sampling; cpu backend): the CPU speed A/B, "
                             "in process CPU ms per step at 1 and 16 sequences")
    parser.add_argument("--out", default=None, help="results file (default results/host_<backend>.json)")
    parser.add_argument("--parts", action="store_true",
                        help="also time the step's parts (schedule_ahead, launch, _fill_step, collect, postprocess, "
                             "_deltas, _finish (postprocess and the step's outputs), take (the consumer's); mean ms "
                             "per step, in decode_parts_ms): the timers add a few us each")
    args = parser.parse_args(argv)
    trees = [Path(t).resolve() for t in args.trees]
    runs = interleaved([str(t) for t in trees], args.rounds,
                       lambda tree: measure(Path(tree), args.backend, args.steps, args.model_work, args.parts),
                       echo=not args.json)
    rounds = {str(tree): results for tree, results in zip(trees, runs, strict=True)}
    summary = {tree: medians(r) for tree, r in rounds.items()}
    launches = {} if args.model_work else count_launches(trees[-1])
    if launches:  # the last tree's: what one steady decode step launches on a GPU (graph + eager), its CUDA calls
        summary[str(trees[-1])]["launches_per_step"] = {n: v["count"] for n, v in launches.items()}
        calls = count_cuda_calls(trees[-1])
        if calls:
            summary[str(trees[-1])]["cuda_calls_per_step"] = calls
    report = {"backend": args.backend, "model_work": args.model_work, "context": CONTEXT,
              "running_for_admission": 15 if args.model_work else RUNNING, "steps": args.steps,
              "trees": summary, "rounds": rounds, "launches": launches}
    if len(trees) == 2:
        old, new = (summary[str(t)] for t in trees)
        report["old_over_new"] = {key: {k: round(old[key][k] / max(new[key][k], 1e-9), 2) for k in new[key]}
                                  for key in old}
    name = f"host_{args.backend}{'_model_work' if args.model_work else ''}.json"
    out = Path(args.out) if args.out else REPO / "benchmarks" / "results" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    if args.json:
        print(json.dumps(summary[str(trees[-1])]))
    else:
        print(json.dumps(report["trees"], indent=1))
        print(f"results written to {out}")


if __name__ == "__main__":
    main()
