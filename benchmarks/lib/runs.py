"""Benchmark helpers: load the paths under test and time one run of N forced-length requests on each.

A run is N requests of exactly `steps` code steps, submitted together. GPT time is from submission to
the last token; end to end adds one batched Decoder+Vocos pass over all N hidden-state sequences.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from benchmarks.lib import probe
from chattts_velocity import audio, load_pretrained, text
from chattts_velocity.assets import AssetPaths, verify_assets
from chattts_velocity.params import InferCodeParams

STEPS_PER_AUDIO_SECOND = audio.SAMPLE_RATE / (2 * audio.HOP_LENGTH)  # 46.875: 2 mel frames per code step
HERE = Path(__file__).resolve().parent
SENTENCES = [
    "The quick brown fox jumps over the lazy dog near the river bank",
    "今天天气很好，我们一起去公园散步吧",
    "Speech synthesis turns written words into natural sounding audio",
    "这是一个用于测试语音合成速度的句子",
    "Every request in this benchmark is forced to the same length",
    "Please remember to bring an umbrella tomorrow morning",
]


@dataclass
class Run:
    path: str  # "velocity", "plain" or "reference"
    concurrency: int
    steps: int  # forced code steps per request
    gpt_seconds: float
    decode_seconds: float | None  # None: end to end not measured
    ttft: list[float] = field(default_factory=list)  # seconds from submission to each request's first token
    cpu_seconds: float = 0.0  # process CPU time during the run (all threads)
    peak_rss_mb: float = 0.0

    @property
    def steps_per_s(self) -> float:
        return self.concurrency * self.steps / self.gpt_seconds

    @property
    def audio_per_s_gpt(self) -> float:
        return self.steps_per_s / STEPS_PER_AUDIO_SECOND

    @property
    def audio_per_s_e2e(self) -> float:
        if self.decode_seconds is None:
            return float("nan")
        return self.concurrency * self.steps / STEPS_PER_AUDIO_SECOND / (self.gpt_seconds + self.decode_seconds)

    @property
    def ttft_mean(self) -> float:
        return sum(self.ttft) / len(self.ttft) if self.ttft else float("nan")

    @property
    def cores_used(self) -> float:
        return self.cpu_seconds / (self.gpt_seconds + (self.decode_seconds or 0.0))

    @property
    def steps_per_cpu_s(self) -> float:
        """Code steps per CPU-second (GPT and decode): work per core granted, steadier than steps/s
        when the host takes cores away mid-run (an OpenMP thread spinning at a barrier still counts)."""
        return self.concurrency * self.steps / max(self.cpu_seconds, 1e-9)

    def as_dict(self) -> dict:
        props = ("steps_per_s", "audio_per_s_gpt", "audio_per_s_e2e", "ttft_mean", "cores_used", "steps_per_cpu_s")
        return {**asdict(self), **{p: getattr(self, p) for p in props}}

    def line(self) -> str:
        decode = "" if self.decode_seconds is None else f", e2e {self.audio_per_s_e2e:.2f} audio s/s"
        return (f"  {self.path:<9} N={self.concurrency:<3} {self.steps_per_s:8.1f} steps/s "
                f"({self.audio_per_s_gpt:.2f} audio s/s GPT{decode}), TTFA {self.ttft_mean:.2f} s, "
                f"{self.cores_used:.2f} cores used, {self.steps_per_cpu_s:.1f} steps per CPU-s")


@dataclass
class Suite:
    """Everything a repeat needs, loaded once."""

    paths: AssetPaths
    llm: object  # engine.llm.LLM
    plain: object | None  # engine.plain.PlainGPT
    decoder: object | None
    vocos: object | None
    decode_dtype: torch.dtype | None
    tokenizer: text.Tokenizer
    speaker: str
    steps: int
    threads: int
    device: str = "cpu"
    load_seconds: dict = field(default_factory=dict)

    def prompts(self, n: int) -> list:
        return [self.tokenizer.code_prompt(t, self.speaker) for t in texts(n)]

    def params(self, mode_eos: int = 625):
        return InferCodeParams(spk_emb=self.speaker, max_new_token=self.steps, min_new_token=self.steps,
                               show_tqdm=False).to_sampling_params("code", mode_eos, return_hidden=True)

    def config(self, args: argparse.Namespace) -> dict:
        options = {k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool, list, type(None)))}
        gpu = torch.cuda.get_device_name() if self.device == "cuda" else None
        return {"options": options, "threads": probe.thread_settings(), "load_seconds": self.load_seconds,
                "torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(), "gpu": gpu}

    def describe(self) -> str:
        loads = ", ".join(f"{k} {v:.1f} s" for k, v in self.load_seconds.items())
        where = f"{self.threads} torch threads" if self.device == "cpu" else torch.cuda.get_device_name()
        return f"assets {self.paths.root}; {where}; loaded: {loads}"


def texts(n: int) -> list[str]:
    return [f"{SENTENCES[i % len(SENTENCES)]} {i}" for i in range(n)]


def load_suite(args: argparse.Namespace) -> Suite:
    from chattts_velocity.demo import ensure_model

    root, verify = ensure_model(args.model, no_verify=getattr(args, "no_verify", False))
    paths = AssetPaths.from_root(root)
    verify_assets(paths, check_sha256=verify)  # load_pretrained reads the files as they are
    loads: dict[str, float] = {}
    start = time.perf_counter()
    device = getattr(args, "device", "cpu")
    llm = load_pretrained(paths, is_vllm=True, device=device, dtype=args.dtype, compile=args.compile_on,
                          backend=getattr(args, "backend", "auto"))
    loads[f"velocity ({args.dtype}, {llm.engine.runner.backend.name} backend)"] = time.perf_counter() - start
    start = time.perf_counter()
    plain = load_pretrained(paths, is_vllm=False, device=device) if args.plain_list else None
    loads["plain"] = time.perf_counter() - start
    decoder = vocos = None
    if not args.no_e2e:
        decoder = audio.Decoder.from_state_dict(audio.load_safetensors(paths.decoder)).to(device).eval()
        vocos = audio.Vocos.from_state_dict(audio.load_safetensors(paths.vocos)).to(device).eval()
    torch.manual_seed(0)
    speaker = text.sample_random_speaker(llm.config.hidden_size)
    decode_dtype = torch.bfloat16 if args.decode_dtype == "bfloat16" else None
    return Suite(paths, llm, plain, decoder, vocos, decode_dtype, text.Tokenizer(paths.tokenizer_dir), speaker,
                 args.steps, torch.get_num_threads(), device, loads)


def _decode(suite: Suite, hiddens: list[torch.Tensor]) -> float | None:
    if suite.decoder is None:
        return None
    start = time.perf_counter()
    audio.decode_hidden_batch(suite.decoder, suite.vocos, hiddens, dtype=suite.decode_dtype)
    return time.perf_counter() - start


def run_velocity(suite: Suite, n: int) -> Run:
    engine, prompts, params = suite.llm.engine, suite.prompts(n), suite.params()
    cpu, start = probe.process_cpu_seconds(), time.perf_counter()
    ids = [engine.add_request(None, p, params) for p in prompts]
    first: dict[str, float] = {}
    hidden: dict[str, list[torch.Tensor]] = {rid: [] for rid in ids}
    while engine.has_unfinished_requests():
        for delta in engine.step():
            if len(delta.token_ids) and delta.request_id not in first:
                first[delta.request_id] = time.perf_counter() - start
            if delta.hidden is not None:
                hidden[delta.request_id].append(delta.hidden)
    gpt = time.perf_counter() - start
    decode = _decode(suite, [torch.cat(hidden[rid]) for rid in ids])
    return Run("velocity", n, suite.steps, gpt, decode, [first[rid] for rid in ids],
               probe.process_cpu_seconds() - cpu, probe.peak_rss_mb())


def run_plain(suite: Suite, n: int) -> Run:
    prompts, params = suite.prompts(n), suite.params()
    first: list[float] = []

    def first_step_done() -> bool:  # PlainGPT calls this after every step
        if not first:
            first.append(time.perf_counter() - start)
        return False

    cpu, start = probe.process_cpu_seconds(), time.perf_counter()
    outputs = suite.plain.generate(prompts, params, progress=False, should_stop=first_step_done)
    gpt = time.perf_counter() - start
    decode = _decode(suite, [o.hidden for o in outputs])
    return Run("plain", n, suite.steps, gpt, decode, first * n, probe.process_cpu_seconds() - cpu,
               probe.peak_rss_mb())


def reference_python() -> Path | None:
    venv = Path(os.environ.get("CHATTTS_REF_VENV") or Path.home() / ".cache" / "chattts_velocity" / "ref-venv")
    python = venv / "bin" / "python"
    return python if (venv / ".chattts_ref_ready").is_file() and python.is_file() else None


def run_reference(suite: Suite, sizes: list[int]) -> list[Run]:
    """chattts 0.2.5 in its own venv (timed inside its process) at each size; [] if the venv is missing."""
    python = reference_python()
    if python is None:
        print("  reference: venv not found (build it with tests/parity/build_ref_venv.sh); skipped")
        return []
    request = {"asset_root": str(suite.paths.root), "steps": suite.steps, "threads": suite.threads,
               "speaker": suite.speaker, "decode": suite.decoder is not None,
               "batches": [texts(n) for n in sizes]}
    with tempfile.TemporaryDirectory(prefix="chattts_bench_") as tmp:
        req, out = Path(tmp) / "request.json", Path(tmp) / "out.json"
        req.write_text(json.dumps(request), encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env.update(OMP_NUM_THREADS=str(suite.threads), TOKENIZERS_PARALLELISM="false", PYTHONNOUSERSITE="1")
        done = subprocess.run([str(python), str(HERE / "reference_side.py"), str(req), str(out)], env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=7200)
        if done.returncode != 0:
            print(f"  reference: failed (exit {done.returncode}): {done.stderr[-2000:]}")
            return []
        results = json.loads(out.read_text(encoding="utf-8"))
    return [Run("reference", r["concurrency"], suite.steps, r["gpt_seconds"], r["decode_seconds"], r["ttft"],
                r["cpu_seconds"], r["peak_rss_mb"]) for r in results]
