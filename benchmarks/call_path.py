"""Where one engine step's batch goes: the package modules its calls visit from `ModelRunner.run` until it returns.

    python -m benchmarks.call_path --model .pytest-assets/tiny                       # this checkout
    python -m benchmarks.call_path --model .pytest-assets/tiny --trees OLD_CHECKOUT .  # two trees, side by side

One fresh process per tree (its tree first on its path): the velocity engine on the given weights (torch backend,
float32, CPU), four requests run to a steady decode step, then `sys.setprofile` over the next `ModelRunner.run`.
Each Python call or return moves the batch into the module of the frame it lands in; frames outside the package
(torch, the standard library) leave it where it was. Consecutive visits to one module are one *stay*; a stay in a
module the batch had already left is a *return*. The same is counted for *folders* (the module's own folder:
engine/worker/sampling) and for *rooms* (engine/'s top-level subfolders, engine/worker/sampling within
engine/worker; engine's top modules the room `engine`; elsewhere the package folder: model/). Prints, per tree, the
stays, the distinct places and the returns at each level, and with --show the paths. No figure here depends on the
host's speed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys
import torch
from chattts_velocity import load_pretrained
from chattts_velocity.schema import Prompt, SamplingParams

torch.manual_seed(0)
llm = load_pretrained(sys.argv[1], is_vllm=True, backend="torch")
engine = llm.engine
for i in range(4):
    ids = torch.full((6, engine.config.num_vq), 3 + i)
    engine.add_request(None, Prompt(ids, torch.ones(6, dtype=torch.bool)),
                       SamplingParams(max_new_token=16, min_new_token=16, seed=i))
for _ in range(3):  # prefill, then decode steps: the traced step is a steady one where the tree has them
    engine.step()
visits = []

def where(frame):
    name = frame.f_globals.get("__name__", "")
    return name if name.startswith("chattts_velocity") else None

def profile(frame, event, arg):
    if event == "call":
        module = where(frame)
    elif event == "return":
        module = where(frame.f_back) if frame.f_back is not None else None
    else:
        return
    if module is not None and (not visits or visits[-1] != module):
        visits.append(module)

runner = engine.runner
run = runner.run

def traced(batch):
    sys.setprofile(profile)
    try:
        return run(batch)
    finally:
        sys.setprofile(None)

runner.run = traced
engine.step()
print(json.dumps(visits))
"""


def room(module: str) -> str:
    """A module's room: a package folder (chattts_velocity.speech), engine/'s subfolders each their own
    (chattts_velocity.engine.worker), engine's top modules the room chattts_velocity.engine."""
    parts = module.split(".")
    if parts[1:2] == ["engine"]:
        return ".".join(parts[:3]) if len(parts) > 3 else "chattts_velocity.engine"
    return ".".join(parts[:2])


def folder(module: str) -> str:
    """The folder a module sits in (chattts_velocity.engine.worker.sampling for its sampler)."""
    return module.rpartition(".")[0]


def stays(path: list[str]) -> list[str]:
    """Consecutive repeats folded: one entry per stay."""
    return [p for i, p in enumerate(path) if i == 0 or path[i - 1] != p]


def returns(path: list[str]) -> int:
    """Stays in a place the path had already left."""
    seen: set[str] = set()
    count = 0
    for place in stays(path):
        count += place in seen
        seen.add(place)
    return count


LEVELS = {"room": room, "folder": folder, "module": lambda module: module}


def summary(visits: list[str]) -> dict:
    """Per level (room, folder, module): its stays, distinct places, returns and path."""
    out = {}
    for level, place in LEVELS.items():
        path = [place(m) for m in visits]
        out[level] = {"stays": len(stays(path)), "places": len(set(path)), "returns": returns(path),
                      "path": stays(path)}
    return out


def trace(tree: Path, model: str) -> list[str]:
    """The module path of one ModelRunner.run in a fresh process of `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", CHILD, model], capture_output=True, text=True, env=env,
                          cwd=str(tree), timeout=600)
    if done.returncode:
        raise SystemExit(f"error: the trace failed in {tree}:\n{done.stderr[-2000:]}")
    visits: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return visits


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="asset folder (tiny random weights are enough)")
    parser.add_argument("--trees", nargs="+", default=[str(Path(__file__).resolve().parents[1])],
                        help="checkouts of this repo (default: this one)")
    parser.add_argument("--show", action="store_true", help="print each tree's path of rooms and modules")
    args = parser.parse_args(argv)
    model = str(Path(args.model).resolve())
    report = {tree: summary(trace(Path(tree).resolve(), model)) for tree in args.trees}
    for tree, levels in report.items():
        print(tree)
        for level, s in levels.items():
            print(f"  {level}s: {s['stays']} stays in {s['places']}, {s['returns']} returns")
            if args.show:
                print("   ", " > ".join(p.removeprefix("chattts_velocity.") for p in s["path"]))
    return report


if __name__ == "__main__":
    main()
