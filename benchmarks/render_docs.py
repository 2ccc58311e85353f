"""Writes every table of benchmark figures in the docs from the committed JSON in benchmarks/results/.

A doc marks a generated table as `<!-- generated: NAME -->` ... `<!-- end -->`; this script replaces what lies
between with the table NAME renders from the JSON (benchmarks/lib/doc_tables.py): docs and results cannot drift apart.

    python -m benchmarks.render_docs            # rewrite the marked blocks in README.md and docs/*.md
    python -m benchmarks.render_docs --check    # exit 1, naming the docs, when a block differs (the test does this)
"""
from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

from benchmarks import audio_parts
from benchmarks.lib import doc_tables as tables  # noqa: E402
from benchmarks.lib import doc_tables_gpu as gpu_tables  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

RESULTS = REPO / "benchmarks" / "results"
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- end -->)", re.S)


def renderers(results: Path) -> dict[str, Callable[[], str]]:
    """Every block name a doc may use -> the function that renders it from the JSON in `results`."""
    found: dict[str, Callable[[], str]] = {
        "hosts": partial(tables.hosts_table, results),
        "weight-bytes": partial(tables.weight_bytes_table, results),
        "invariance-ab": partial(tables.from_json, tables.ab_table, results, "invariance_ab"),
        "invariance-ab-noamx": partial(tables.from_json, tables.ab_table, results, "invariance_ab_noamx"),
        "kernels-ab": partial(tables.from_json, tables.kernels_ab_table, results, "kernels_ab"),
        "kv-int8": partial(tables.from_json, tables.kv_int8_table, results, "kv_int8"),
        "engine-ratios": partial(tables.engine_ratios_table, results),
        "engine-ttfa": partial(tables.engine_ttfa_table, results),
        "decode-ab": partial(tables.decode_ab_table, results),
        "attention": partial(tables.from_json, tables.attention_table, results, "kernels"),
        "host-loop": partial(tables.host_loop_table, results),
        "gpu-check": partial(gpu_tables.gpu_check_table, results),
        "gpu-step": partial(gpu_tables.gpu_step_table, results),
        "gpu-kernels": partial(gpu_tables.gpu_kernels_table, results),
    }
    for dtype in ("float32", "bfloat16", "int8"):
        found[f"engine.{dtype}"] = partial(tables.from_json, tables.engine_table, results, dtype)
    for kind in tables.host_kinds(results, "cpu_"):
        for part, render_one in (("targets", tables.targets_table), ("throughput", tables.throughput_table),
                                 ("streams", tables.streams_table), ("probes", tables.probes_line)):
            found[f"{kind}.{part}"] = partial(tables.from_json, render_one, results, f"cpu_{kind}")
    for kind in tables.host_kinds(results, "cpu_"):
        found[f"{kind}.stages"] = partial(stages_for, results, kind)
    for kind in tables.host_kinds(results, "llamacpp_"):
        found[f"{kind}.llamacpp"] = partial(tables.llamacpp_table, results, kind)
    for kind in tables.host_kinds(results, "isa_"):
        found[f"isa-{kind}.steps"] = partial(tables.from_json, tables.isa_steps_table, results, f"isa_{kind}")
        found[f"isa-{kind}.linears"] = partial(tables.from_json, tables.isa_linears, results, f"isa_{kind}")
    for kind in tables.host_kinds(results, "audio_parts_"):
        for part, render_audio in (("parts", audio_parts.parts_table), ("shares", audio_parts.shares_table)):
            found[f"audio-{kind}.{part}"] = partial(tables.from_json, render_audio, results, f"audio_parts_{kind}")
    for kind in tables.host_kinds(results, "serve_"):
        found[f"serve-{kind}"] = partial(tables.from_json, tables.serve_table, results, f"serve_{kind}")
    return found


def stages_for(results: Path, kind: str) -> str:
    llamacpp = results / f"llamacpp_{kind}.json"
    return tables.stages_table(tables.load(results, f"cpu_{kind}"),
                               tables.load(results, f"llamacpp_{kind}") if llamacpp.exists() else None)


def render(text: str, results: Path = RESULTS) -> str:
    """`text` with every marked block's body replaced by the table its name renders."""
    known = renderers(results)

    def fill(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in known:
            raise ValueError(f"unknown generated block {name!r}; known: {', '.join(sorted(known))}")
        return f"{match[1]}{known[name]()}\n{match[4]}"

    return BLOCK.sub(fill, text)


def documents() -> list[Path]:
    candidates = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    return [p for p in candidates if "<!-- generated:" in p.read_text(encoding="utf-8")]


def stale_documents(results: Path = RESULTS) -> list[str]:
    """The docs whose marked blocks differ from what the JSON renders."""
    return [str(p.relative_to(REPO)) for p in documents() if render(p.read_text(encoding="utf-8"), results)
            != p.read_text(encoding="utf-8")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report docs that differ from the JSON")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_documents()
        for name in stale:
            print(f"{name}: generated tables differ from benchmarks/results (run python -m benchmarks.render_docs)")
        return 1 if stale else 0
    for path in documents():
        path.write_text(render(path.read_text(encoding="utf-8")), encoding="utf-8")
        print(f"rendered {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
