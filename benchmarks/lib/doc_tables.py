"""The tables render_docs.py writes into the docs, each rendered from the committed JSON in benchmarks/results/."""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from statistics import median

from benchmarks.bench_isa import linears_table as isa_linears_table
from benchmarks.bench_isa import table as isa_table

DTYPES = ("bfloat16", "int8")
LLAMA_PAIRS = {"bfloat16": "BF16", "int8": "Q8_0", "int4": "Q4_0"}  # ours -> llama.cpp's of the same bytes/weight


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def host_kinds(results: Path, prefix: str) -> list[str]:
    return sorted(p.stem[len(prefix):] for p in results.glob(f"{prefix}*.json"))


def load(results: Path, name: str) -> dict:
    return json.loads((results / f"{name}.json").read_text(encoding="utf-8"))


def hosts_table(results: Path) -> str:
    rows = []
    for kind in host_kinds(results, "cpu_"):
        run = load(results, f"cpu_{kind}")
        cpu = run["cpu"]
        emulated = f", **emulating {run['emulated_isa']}**" if run.get("emulated_isa") else ""
        rows.append([f"`{kind}`", f"{cpu['model']} (family {cpu['cpu_family']} model {cpu['cpu_model']}{emulated})",
                     ", ".join(cpu["flags"]), f"{run['ceilings']['read_gbps']:.1f}",
                     f"{run['ceilings']['bf16_gemm_gflops']:.0f}", f"`results/cpu_{kind}.json`"])
    return table(["host kind", "CPU", "flags the kernels use", "read GB/s (2 threads)", "bf16 GEMM GFLOP/s",
                  "file"], rows)


def weight_bytes_table(results: Path) -> str:
    kinds = host_kinds(results, "cpu_")
    runs = {kind: load(results, f"cpu_{kind}") for kind in kinds}
    per_step = runs[kinds[0]]["weight_bytes_per_step"]
    rows = []
    for dtype in ("float32", "bfloat16", "int8"):
        ceilings = [f"{runs[k]['ceilings']['read_gbps'] * 1e9 / per_step[dtype]:.0f}" for k in kinds]
        rows.append([dtype, f"{per_step[dtype] / 1e6:.0f} MB", *ceilings])
    return table(["precision", "weights read per step", *[f"steps/s ceiling on `{k}`" for k in kinds]], rows)


def targets_table(run: dict) -> str:
    rows = []
    for t in run["targets"]:
        name = re.sub(r"^\d+: ", "", t["target"]).replace("the issue's ", "")
        if t.get("skipped"):
            rows.append([name, "not measured: " + t["skipped"].split(";")[0], "skipped"])
        else:
            rows.append([name, f"{t['measured']:.3g}", "yes" if t["met"] else "**no**"])
    return table(["target", "measured", "met"], rows)


def throughput_table(run: dict) -> str:
    rows = []
    for dtype in DTYPES:
        m = run["measured"][dtype]
        b32, b64 = m["batch"]["32"], m["batch"]["64"]
        rows.append([dtype, f"{m['one_stream_steps_per_s']:.1f}",
                     f"{b32['steps_per_s_e2e']:.0f} / {b32['steps_per_s_gpt']:.0f}",
                     f"{b64['steps_per_s_e2e']:.0f} / {b64['steps_per_s_gpt']:.0f}",
                     f"{b32['decode_share']:.1%} / {b64['decode_share']:.1%}"])
    return table(["precision", "one stream steps/s (prefill excluded)", "32 concurrent e2e / GPT steps/s",
                  "64 concurrent e2e / GPT steps/s", "Decoder+Vocos share at 32 / 64"], rows)


def stages_table(run: dict, llamacpp: dict | None) -> str:
    """Chat.infer end to end per stage (the run's "stages"), and its code steps/s against llama.cpp's decode alone
    at the same bytes per weight (prefill excluded there, included here)."""
    rows = []
    for dtype, m in run["measured"].items():
        if not isinstance(m, dict) or "stages" not in m:
            continue
        for n, st in sorted(m["stages"].items(), key=lambda item: int(item[0])):
            e2e = st["concurrency"] * st["steps"] / st["wall_s"]
            theirs = (llamacpp or {}).get("llama_cpp_tokens_per_s", {}).get(LLAMA_PAIRS.get(dtype, ""), {}).get(n)
            share = st["share"]
            rows.append([dtype, n, f"{e2e:.1f}", f"{e2e / theirs:.2f}x" if theirs else "-",
                         *[f"{share[k]:.1%}" for k in ("gpt_prefill", "gpt_decode", "decoder", "vocos", "python")],
                         f"**{st['non_gpt_share']:.1%}**"])
    return table(["precision", "texts", "e2e steps/s", "vs llama.cpp decode", "GPT prefill", "GPT decode", "Decoder",
                  "Vocos", "Python and the rest", "not GPT"], rows)


def streams_table(run: dict) -> str:
    rows = [[name, f"{s['ttfa_alone_s']:.2f}", f"{s['ttfa_among_16_s']:.2f}", f"{s['first_chunk_error']:.1e}"]
            for name, s in run["measured"]["streams"].items()]
    return table(["stream setting (bf16)", "first audio alone s", "among 16 s (slowest)",
                  "first-chunk max abs error"], rows)


def llamacpp_table(results: Path, kind: str) -> str:
    path = results / f"llamacpp_{kind}.json"
    if not path.exists():
        return "llama.cpp: not measured on this host kind."
    run = json.loads(path.read_text(encoding="utf-8"))
    sizes = list(run["ours_steps_per_s"]["bfloat16"])
    rows = [[f"llama.cpp {q}", *[f"{rates[n]:.1f}" for n in sizes]]
            for q, rates in run["llama_cpp_tokens_per_s"].items()]
    rows += [[f"ours {d}", *[f"{rates[n]:.1f}" for n in sizes]] for d, rates in run["ours_steps_per_s"].items()]
    for ours, theirs in LLAMA_PAIRS.items():
        if ours not in run["ours_steps_per_s"] or theirs not in run["llama_cpp_tokens_per_s"]:
            continue
        rows.append([f"ours {ours} / llama.cpp {theirs}", *[
            f"**{run['ours_steps_per_s'][ours][n] / run['llama_cpp_tokens_per_s'][theirs][n]:.2f}x**"
            for n in sizes]])
    return table(["tokens or code steps/s at N =", *sizes], rows)


def probes_line(run: dict) -> str:
    before, after = run["probes"], run["probes_after"]
    return (f"Probes before / after the run: {before['read_gbps']:.1f} / {after['read_gbps']:.1f} GB/s read, "
            f"{before['bf16_gemm_gflops']:.0f} / {after['bf16_gemm_gflops']:.0f} bf16 GFLOP/s; the targets use "
            f"the better of the two. Whole run: {run['seconds']:.0f} s.")


def ab_table(ab: dict) -> str:
    rows = []
    sizes = list(ab["results"]["bfloat16"])
    for n in sizes:
        row = [n]
        for dtype in DTYPES:
            cell = ab["results"][dtype][n]
            old, new = median(cell["old"]), median(cell["new"])
            row += [f"{old:.0f} -> {new:.0f}", f"**{cell['ratio_new_over_old']:.2f}x**"]
        rows.append(row)
    return table(["N", "bf16 old -> new steps/s (median)", "ratio", "int8 old -> new steps/s", "ratio"], rows)


def kernels_ab_table(ab: dict) -> str:
    names = sorted({k.rsplit(" ", 1)[0] for k in ab["1"]})
    rows = [[name, *[f"{ab[n][name + ' new'] / ab[n][name + ' old']:.2f}" for n in ab]] for name in names]
    return table(["kernel", *[f"new / old time at {n} rows" for n in ab]], rows)


def kv_int8_table(run: dict) -> str:
    rows = [[threads, f"{t['ms_per_step_median']['auto']:.1f}", f"{t['ms_per_step_median']['int8']:.1f}",
             f"**{t['int8_speedup']:.2f}x**"] for threads, t in run["threads"].items()]
    return table(["threads", "bf16 KV ms/step", "int8 KV ms/step", "int8 / bf16 speed"], rows)


def engine_table(run: dict) -> str:
    rows = [[r["path"], str(r["concurrency"]), f"{r['steps_per_s_best']:.1f}", f"{r['steps_per_s_median']:.1f}",
             f"{r['audio_per_s_gpt_median']:.2f}", f"{r['audio_per_s_e2e_median']:.2f}",
             f"{r['ttft_mean_median']:.2f}"] for r in run["rows"]]
    return table(["path", "N", "steps/s best", "median", "audio s/s GPT", "end to end", "1st code s"], rows)


def engine_ratios_table(results: Path) -> str:
    keys = ("velocity@1 / plain@1 (GPT)", "velocity@16 / plain@16 (GPT)", "32 concurrent vs plain@16 (GPT)",
            "32 concurrent vs plain@16 (end to end)")
    runs = {d: load(results, d) for d in ("float32", "bfloat16", "int8")}
    return table(["same-run ratio (median of the repeats)", *runs],
                 [[key, *[f"{run['ratios'][key]:.2f}x" for run in runs.values()]] for key in keys])


def engine_ttfa_table(results: Path) -> str:
    runs = {d: load(results, d)["stream_ttfa"] for d in DTYPES}
    labels = list(dict.fromkeys(s["label"] for s in runs["bfloat16"]))

    def ttfa(dtype: str, label: str, n: int) -> str:
        return next(f"{s['ttfa_median']:.2f} s" for s in runs[dtype] if s["label"] == label and s["concurrency"] == n)

    rows = [[label, *[ttfa(d, label, n) for d in DTYPES for n in (1, 16)],
             max(f"{s['max_abs_diff']:.0e}" for d in DTYPES for s in runs[d] if s["label"] == label)]
            for label in labels]
    return table(["stream option set", "bf16 N=1", "bf16 N=16", "int8 N=1", "int8 N=16", "max abs error"], rows)


def decode_ab_table(results: Path) -> str:
    rows = []
    for dtype in DTYPES:
        for n, cell in load(results, f"decode_ab_{dtype}")["batches"].items():
            ms = cell["ms_per_step_median"]
            rows.append([dtype, n, *[f"{v:.1f}" for v in ms.values()]])
    columns = list(load(results, "decode_ab_bfloat16")["batches"]["1"]["ms_per_step_median"])
    return table(["dtype", "N", *[f"{c} ms/step" for c in columns]], rows)


def attention_table(run: dict) -> str:
    rows = [[shape, f"{c['kernel']['best_ms']:.1f}", f"{c['compiled torch']['best_ms']:.1f}",
             f"{c['compiled torch']['best_ms'] / c['kernel']['best_ms']:.1f}x", f"{c['kernel']['gb_per_s_best']:.1f}"]
            for shape, c in run["attention"].items()]
    return table(["20 layers, sequences x context", "kernel ms", "torch.compile ms", "speedup", "kernel GB/s"], rows)


def isa_steps_table(run: dict) -> str:
    return isa_table({**run, "linears": None})


def isa_linears(run: dict) -> str:
    return isa_linears_table(run["linears"])


def serve_table(run: dict) -> str:
    server, engine = run["server"], run["engine"]
    rows = [[n, f"{server[n]['audio_s_per_s']:.2f}", f"{engine[n]['audio_s_per_s']:.2f}", f"{r['throughput']:.2f}",
             f"{server[n]['ttfa_mean']:.2f} s", f"{engine[n]['ttfa_mean']:.2f} s", f"{r['ttfa']:.2f}"]
            for n, r in run["ratios"].items()]
    return table(["requests", "server audio s/s", "in-process audio s/s", "ratio", "server TTFA", "in-process TTFA",
                  "ratio"], rows)


def host_loop_table(results: Path) -> str:
    """Host ms per step, the tree before and after, per backend (host_<backend>.json)."""
    runs = {backend: load(results, f"host_{backend}") for backend in ("triton", "cpu")}
    columns = [(b, tree) for b, run in runs.items() for tree in run["trees"]]
    labels = {"decode_host_ms": "decode at N = {}", "admit_host_ms": "admitting a {}-row prompt among {} (extra)"}
    rows = []
    for part, label in labels.items():
        for n in runs["triton"]["trees"][columns[0][1]][part]:
            name = label.format(n, runs["triton"]["running_for_admission"])
            rows.append([name, *[f"{runs[b]['trees'][tree][part][n]:.2f}" for b, tree in columns]])
    return table(["host ms per step", "triton before", "triton after", "cpu before", "cpu after"], rows)


def from_json(render_one: Callable[[dict], str], results: Path, name: str) -> str:
    return render_one(load(results, name))
