"""Batch export through the Python API: a file of lines -> one WAV per line, resumable, with a manifest.

    python examples/batch_export.py lines.txt -o out/batch [--model models/chattts] [--seed 42]

Same as `chattts-velocity export`. Without an input file it writes a small JSONL example first.
Run it twice: the second run skips every finished WAV.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from chattts_velocity import Chat, InferCodeParams
from chattts_velocity.demo import default_max_new_token, ensure_model
from chattts_velocity.export import plan_export, run_export


def example_input(path: Path, speaker: str) -> Path:
    """One JSON object per line: text, and optionally id, speaker, seed, output."""
    if path.exists():  # keep the first run's file, so a second run resumes it
        return path
    rows = [
        {"id": "greeting", "text": "Hello! Every line of this file becomes one WAV."},
        {"id": "narrator/intro", "text": "Lines run together through one engine batch.", "speaker": speaker},
        {"text": "A seed makes a line reproducible.", "seed": 7, "output": "seeded/line3.wav"},
        {"text": ""},  # a bad line: reported in the manifest and skipped, the others still run
    ]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input", nargs="?", help="text file (one line per WAV) or .jsonl")
    parser.add_argument("-o", "--output-dir", default="out/batch")
    parser.add_argument("--model", default="demo", help="asset folder, or 'demo' for random demo weights")
    parser.add_argument("--tiny", action="store_true", help="with --model demo: test-size weights")
    parser.add_argument("--no-verify", action="store_true", help="custom or fine-tuned weights: skip the sha256 check")
    parser.add_argument("--seed", type=int, default=None, help="line k uses seed + k - 1 (default: random)")
    parser.add_argument("--max-new-token", type=int, default=None,
                        help="cap on audio steps per sentence (default: lower on demo weights, which rarely stop)")
    args = parser.parse_args()

    root, verify = ensure_model(args.model, args.tiny, args.no_verify)
    chat = Chat()
    chat.load(source="custom", custom_path=root, verify=verify, use_vllm=True)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    source = args.input or example_input(out / "example.jsonl", chat.sample_random_speaker())

    plan = plan_export(source, out, seed=args.seed)  # checks every line; no audio yet
    print(f"{len(plan.todo)} lines to synthesise, {plan.count('skipped')} already done")
    cap = default_max_new_token(args.model) if args.max_new_token is None else args.max_new_token
    run_export(chat, plan, InferCodeParams(max_new_token=cap, show_tqdm=False))
    for line in plan.lines:  # also in out/manifest.json
        print(f"line {line.line}: {line.status:7s} {line.output or '-'} seed={line.seed} {line.error or ''}")
    raise SystemExit(1 if plan.count("error") else 0)


if __name__ == "__main__":
    main()
