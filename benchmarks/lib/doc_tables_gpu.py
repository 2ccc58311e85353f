"""The GPU tables render_docs.py writes into docs/gpu.md, from results/gpu_check.json (and the bench_engine runs it
made, results/gpu_check_runs/) and results/profile_gpu_step.json. Every figure names the card and says whether it
is steady decode (prefill and the first step left out) or end to end (submission to the last token).

Steady decode from a bench_engine run: (GPT wall time - the first token's time) / (steps - 1) a step, valid only
when every request got its first token in the same step (one wave); a run whose requests started in waves (more
requests than max_num_seqs) has no steady figure for its nominal concurrency.
"""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks.lib.doc_tables import table

ONE_WAVE_S = 0.005  # first tokens this close together came from one prefill step


def steady_ms(run: dict) -> float | None:
    """ms a step after the first, from one bench_engine run; None when its requests ran in waves."""
    if max(run["ttft"]) - min(run["ttft"]) > ONE_WAVE_S:
        return None
    return 1e3 * (run["gpt_seconds"] - max(run["ttft"])) / (run["steps"] - 1)


def engine_runs(results: Path, backend: str) -> dict[str, dict]:
    path = results / "gpu_check_runs" / f"gpu_check_{backend}.json"
    runs = json.loads(path.read_text(encoding="utf-8"))["repeats"][0]["runs"]
    return {str(r["concurrency"]): r for r in runs}


def gpu_check_table(results: Path) -> str:
    """Steady and end-to-end sequence-steps/s per backend and concurrency (either JSON layout of gpu_check)."""
    run = json.loads((results / "gpu_check.json").read_text(encoding="utf-8"))
    if "steady_steps_per_s" in run:
        return gpu_figures_table(run)
    rows = []
    backends = run["backends"]
    for n in next(iter(backends.values()))["concurrency"]:
        row = [n]
        for name, b in backends.items():
            r = engine_runs(results, name)[n]
            ms = steady_ms(r)
            roof = b["concurrency"][n]["roofline_steps_per_s"]
            row.append("none: its requests started in waves" if ms is None else
                       f"{int(n) / ms * 1e3:,.0f} ({ms:.2f} ms a step, {int(n) / ms * 1e3 / roof:.1%} of roofline)")
            first = "first step" if ms is not None else "the last wave's first step ends at"
            row.append(f"{r['steps_per_s']:,.0f} ({first} {1e3 * max(r['ttft']):.0f} ms)")
        rows.append(row)
    rows.append(["host syncs per decode step as SyncDetector counts them (on CUDA it misses the blocking copy of "
                 "the sampled ids)",
                 *[x for b in backends.values() for x in (f"{b['host_syncs_per_decode_step']:g}", "")]])
    rows.append(["time to first audio, 1 request (end to end)",
                 *[x for b in backends.values() for x in (f"{b['ttfa_s']:.2f} s", "")]])
    tests = run["tests"]
    header = [f"{run['device']}, {run['dtype']} ({tests['passed']} GPU tests passed, {len(tests['failed'])} failed)"]
    for name in backends:
        header += [f"{name}: steady decode, steps/s", f"{name}: end to end, {run['steps']} steps, steps/s"]
    return table(header, rows)


def gpu_figures_table(run: dict) -> str:
    """The figures of one gpu_check run (the current layout), each row naming the card."""
    card = run["device"]

    def num(value: float | None, form: str = ",.0f") -> str:
        return "not measured" if value is None else format(value, form)

    rows = [[f"steady decode, {n} sequence(s) (sequence-steps/s)", card, num(run["steady_steps_per_s"].get(n)),
             num((run["overlapped_steps_per_s"] or {}).get(n)), num(run["end_to_end_steps_per_s"].get(n))]
            for n in ("1", "16", "64", "256")]
    for n, contexts in run["replay_ms"].get("new", {}).items():
        for c, ms in contexts.items():
            old = run["replay_ms"].get("old", {}).get(n, {}).get(c)
            rows.append([f"one decode of the layers, {n} row(s) at context {c} (ms, new / old backend)", card,
                         f"{ms:.3f}", "", num(old, ".3f")])
    rows.append(["kernels per decode step, 1 / 64 sequences", card,
                 " / ".join(num(run["kernels_per_step"].get(n)) for n in ("1", "64")), "", ""])
    rows.append(["widest step that ran (sequences)", card, num(run["max_concurrent"]), "", ""])
    rows.append([f"seeded {run['dtype']} codes alone = among 63 others", card, str(run["invariant_alone_vs_63"]),
                 "", ""])
    rows.append(["64 streaming clients: audio seconds per second (end to end)", card,
                 num(run["stream64_audio_s_per_s"], ",.1f"), "", ""])
    rows.append(["time to first audio, 1 / 64 clients (s, end to end)", card,
                 " / ".join(num(run["ttfa_s"].get(n), ".3f") for n in ("1", "64")), "", ""])
    return table(["figure", "card", "measured (synchronous loop)", "overlapped loop", "end to end / old backend"],
                 rows)


def gpu_step_table(results: Path) -> str:
    """A decode step against its graph replay; the step timed with no profiler attached where the JSON has it."""
    run = json.loads((results / "profile_gpu_step.json").read_text(encoding="utf-8"))
    timed_bare = "cprofile_step_ms_median" in run["sizes"][next(iter(run["sizes"]))]
    steady = {} if timed_bare else {n: steady_ms(r) for n, r in engine_runs(results, "triton").items()}
    rows = []
    for n, r in run["sizes"].items():
        bare = r["step_ms_median"] if timed_bare else steady.get(n)
        profiled = r["cprofile_step_ms_median"] if timed_bare else r["step_ms_median"]
        share = "" if bare is None else f"{1 - r['graph_replay_ms'] / bare:.0%}"
        rows.append([n, "" if bare is None else f"{bare:.2f}", f"{profiled:.2f}", f"{r['graph_replay_ms']:.2f}",
                     share])
    source = "profile_gpu_step" if timed_bare else "gpu_check's steady decode"
    return table([f"{run['device']}: sequences", f"step ms, no profiler ({source})", "step ms under cProfile",
                  "graph replay ms (device)", "host share of the step"], rows)


def gpu_kernels_table(results: Path, top: int = 6) -> str:
    """Device microseconds per decode step by kernel at 1 and 64 sequences (profile_gpu_kernels.py), largest first,
    the rest summed; each kernel's launches per step beside its time."""
    run = json.loads((results / "profile_gpu_kernels.json").read_text(encoding="utf-8"))
    sizes = [n for n, rows in run["kernels"].items() if isinstance(rows, list)]
    first = run["kernels"][sizes[0]]
    names = [row["kernel"] for row in first[:top]]
    body = []
    for name in names:
        cells = []
        for n in sizes:
            row = next((r for r in run["kernels"][n] if r["kernel"] == name), None)
            cells.append("" if row is None else f"{row['us_per_step']:,.0f} ({row['per_step']:g} launches)")
        body.append([name.split("(")[0].removeprefix("void ")[:48], *cells])
    rest = [f"{sum(r['us_per_step'] for r in run['kernels'][n] if r['kernel'] not in names):,.0f}" for n in sizes]
    total = [f"{sum(r['us_per_step'] for r in run['kernels'][n]):,.0f}" for n in sizes]
    body += [["every other kernel and copy", *rest], ["**all device work of a step**", *total]]
    head = [f"{run['device']}: kernel (bf16, triton backend)", *(f"us per step, {n} sequence(s)" for n in sizes)]
    return table(head, body)
