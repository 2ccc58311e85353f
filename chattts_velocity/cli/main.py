"""`chattts-velocity` command line: say | demo | demo-assets | export | serve | webui | bench."""
from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from ..audio.wav import SAMPLE_RATE
from ..demo import uses_demo_weights
from .common import (
    add_model_flags,
    add_step_cap_flag,
    engine_options,
    load_chat,
    max_new_token,
    model_folder,
    package_warnings_in_one_line,
    resolve_dtype,
    seed_speakers,
)
from .env_config import resolve_env
from .say import add_say_flags, cmd_say
from .serve import add_serve_parser
from .webui import add_webui_parser

if TYPE_CHECKING:
    from ..export import ExportPlan
    from ..params import InferCodeParams
    from .common import Subparsers

DEMO_TEXTS = [
    "Hello! This is chattts velocity, reading a short sentence.",
    "你好，欢迎使用这个语音合成引擎。",
    "Many users can share one engine, and every voice can be reproduced from a seed.",
]


def cmd_demo_assets(args: argparse.Namespace) -> None:
    from ..demo import check_demo_target, write_demo_assets

    check_demo_target(args.dir, args.force)
    paths = write_demo_assets(args.dir, seed=args.seed, tiny=args.tiny)
    print(f"demo assets written to {paths.root}")


def cmd_demo(args: argparse.Namespace) -> None:
    from ..audio import write_wav

    chat = load_chat(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    speaker = chat.sample_random_speaker(seed=args.seed)  # the same voice on every run with the same --seed
    params = chat.InferCodeParams(spk_emb=speaker, manual_seed=args.seed, max_new_token=max_new_token(args))
    start = time.perf_counter()
    wavs = chat.infer(DEMO_TEXTS, skip_refine_text=True, params_infer_code=params)
    wall = time.perf_counter() - start
    seconds = sum(len(w) for w in wavs) / SAMPLE_RATE
    for i, wav in enumerate(wavs):
        path = out / f"demo_{i:02d}.wav"
        write_wav(path, wav)
        print(f"{path}  {len(wav) / SAMPLE_RATE:.2f} s")
    print(f"{seconds:.2f} s of audio in {wall:.2f} s wall: real-time factor {wall / max(seconds, 1e-9):.3f} "
          f"({seconds / wall:.2f}x real time)")
    if uses_demo_weights(args.model):
        print("note: demo weights are random, so the audio is noise-like; see models/README.md for real voices")
    model = f"--model {args.model}" + (" --tiny" if args.tiny else "")
    print(f"next: chattts-velocity say \"Your text.\" -o hello.wav {model}  |  chattts-velocity serve {model}  |  "
          f"chattts-velocity webui {model}  (each takes --help)")


def cmd_export(args: argparse.Namespace) -> None:
    from ..export import plan_export, run_export
    from ..params import InferCodeParams

    params = InferCodeParams(max_new_token=max_new_token(args), show_tqdm=False)
    from ..text.voices import VoiceLibrary

    if args.input != "-" and not Path(args.input).is_file():
        raise ValueError(f"input: {args.input} is not a file; give a text file (one utterance per line), a JSONL "
                         "file, or '-' for stdin")
    plan = plan_export(args.input, args.output_dir, seed=args.seed, speaker=args.speaker or None, params=params,
                       voice=args.voice, voices=VoiceLibrary(args.voices) if args.voices else None,
                       loudness=args.loudness, timestamps=args.timestamps, speaker_for_seed=seed_speakers(args),
                       captions=args.captions)
    signal.signal(signal.SIGTERM, _interrupt)  # a kill ends like Ctrl-C: finished lines stay on record
    try:
        if args.ray:
            _export_with_ray(args, plan, params)
        else:
            run_export(load_chat(args) if plan.todo else None, plan, params)
    finally:
        plan.release()  # also when the model fails to load: the lock file goes (release is idempotent)
    if plan.count("error"):
        raise SystemExit(1)


def _export_with_ray(args: argparse.Namespace, plan: ExportPlan, params: InferCodeParams) -> None:
    from ..cluster import init_ray  # imports no ray: init_ray sets the loopback env first
    from ..export import ray as ray_export

    root, verify = model_folder(args)
    options = ray_export.RayExportOptions(actors=args.actors, cpus_per_actor=args.cpus_per_actor,
                                          gpus_per_actor=args.gpus_per_actor, batch_size=args.batch_size)
    if plan.todo:
        init_ray(args.ray_address, log_to_driver=True)
    ray_export.run_export_ray(root, plan, params, options, verify=verify, dtype=resolve_dtype(args),
                              **engine_options(args))


def _add_export_ray_flags(p: argparse.ArgumentParser) -> None:
    from ..export.ray import RayExportOptions

    default = RayExportOptions()
    g = p.add_argument_group("Ray (needs the [ray] extra)")
    g.add_argument("--ray", action="store_true",
                   help="synthesise on a pool of Ray actors, the same files as without; this process writes them")
    g.add_argument("--ray-address", default=None, help="join this Ray cluster; default: a private loopback cluster")
    g.add_argument("--actors", type=int, default=default.actors,
                   help="engines synthesising at once, one per actor (default %(default)s)")
    g.add_argument("--cpus-per-actor", type=float, default=default.cpus_per_actor,
                   help="keep actors x this below the cluster's CPUs (default %(default)s)")
    g.add_argument("--gpus-per-actor", type=float, default=default.gpus_per_actor,
                   help="GPUs Ray reserves per actor (default %(default)s)")
    g.add_argument("--batch-size", type=int, default=default.batch_size,
                   help="lines an actor synthesises together, one shard (default %(default)s)")


CHECKOUT = Path(__file__).resolve().parents[2]  # the source checkout's root, when the package runs from one


def bench_module(root: Path = CHECKOUT) -> ModuleType:
    """benchmarks/bench_engine.py of the source checkout at `root` (the same code as `python -m
    benchmarks.bench_engine` there), imported with its package; an installed wheel holds no benchmarks: a one-line
    error says the command needs the repository."""
    import importlib
    import importlib.util

    folder = root / "benchmarks"
    if not (folder / "__init__.py").is_file() or not (folder / "bench_engine.py").is_file():
        raise SystemExit("bench: needs a source checkout of chattts_velocity (the benchmarks are not part of the "
                         "installed package); in a clone, `pip install -e .` and run `chattts-velocity bench` or "
                         "`python -m benchmarks.bench_engine`")
    if "benchmarks" not in sys.modules:
        spec = importlib.util.spec_from_file_location("benchmarks", folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])
        if spec is None or spec.loader is None:
            raise SystemExit(f"bench: {folder} is not a Python package")
        sys.modules["benchmarks"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["benchmarks"])
    return importlib.import_module("benchmarks.bench_engine")


def bench_argv(argv: list[str]) -> list[str]:
    """`chattts-velocity bench` arguments: results outside the source tree unless --out says where."""
    from ..demo import cache_dir

    given = any(a == "--out" or a.startswith("--out=") for a in argv)
    return argv if given or "-h" in argv or "--help" in argv else [*argv, "--out", str(cache_dir() / "bench")]


def _add_bench(sub: Subparsers) -> None:
    # `main` hands every argument after `bench` to benchmarks/bench_engine.py unparsed.
    sub.add_parser("bench", help="velocity vs plain path (and reference) in the same run; JSON results (from a "
                                 "source checkout only: it runs its benchmarks/bench_engine.py)",
                   add_help=False)


def _add_export(sub: Subparsers) -> None:
    p = sub.add_parser("export", help="synthesise every line of a text or JSONL file to its own WAV (resumable)")
    p.add_argument("input", help="text file (one utterance per line) or JSONL (text, id, speaker, voice, seed, "
                                 "output); '-' reads stdin")
    p.add_argument("-o", "--output-dir", required=True, help="folder for the WAVs and manifest.json")
    add_model_flags(p)
    p.add_argument("--seed", type=int, default=None,
                   help="line k uses seed + k - 1 (default: a random seed per line, kept in the manifest)")
    p.add_argument("--speaker", default="", help="speaker string for lines without their own")
    p.add_argument("--voice", default=None,
                   help="the voice of lines without their own, as the server takes it: a saved voice (POST "
                        "/v1/audio/voices), a preset name, an integer seed, a speaker string or a blend such as "
                        "'alloy(2)+1234(1)'")
    p.add_argument("--voices", metavar="DIR", default=None,
                   help="the voice library folder (default $CHATTTS_VELOCITY_VOICES or "
                        "~/.cache/chattts_velocity/voices)")
    add_step_cap_flag(p)
    p.add_argument("--timestamps", action="store_true",
                   help="also write each WAV's sentence spans to NAME.timestamps.json ([{text, start, end}], seconds)")
    p.add_argument("--captions", choices=("srt", "vtt"), default=None,
                   help="also write each WAV's sentence captions beside it (NAME.srt or NAME.vtt)")
    p.add_argument("--loudness", type=float, default=None, metavar="LUFS",
                   help="normalise every WAV to this integrated loudness (e.g. -16; peak-limited, length unchanged)")
    _add_export_ray_flags(p)
    p.set_defaults(func=cmd_export)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chattts-velocity", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo-assets", help="write random demo weights in the official file format")
    p.add_argument("dir", help="folder to write; the files go to DIR/asset/... (load it with --model DIR)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    p.add_argument("--tiny", action="store_true", help="test-size dimensions (fast; for tests and trials)")
    p.add_argument("--force", action="store_true",
                   help="write even into a folder that holds other files (they may be overwritten)")
    p.set_defaults(func=cmd_demo_assets)

    for name, func, help_ in (("say", cmd_say, "synthesise one text to a WAV file"),
                              ("demo", cmd_demo, "synthesise the example texts with demo weights")):
        p = sub.add_parser(name, help=help_)
        if name == "say":
            add_say_flags(p)
        else:
            p.add_argument("--out", default="out/demo", metavar="DIR",
                           help="folder for the WAVs, created if missing (default out/demo)")
        add_model_flags(p)
        p.add_argument("--seed", type=int, default=0 if name == "demo" else None,
                       help="sampling seed, and for demo also the speaker's (default: 0 for demo, random for say)")
        add_step_cap_flag(p)
        p.set_defaults(func=func)
    _add_export(sub)
    add_serve_parser(sub)
    add_webui_parser(sub)
    _add_bench(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    package_warnings_in_one_line()
    if argv[:1] == ["bench"]:
        bench_module().main(bench_argv(argv[1:]))
        return
    args = build_parser().parse_args(argv)
    try:
        resolve_env(args)  # defaults from CHATTTS_VELOCITY_<FLAG> (cli/env_config.py), checked like the flags
        args.func(args)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    except OSError as exc:  # a file the command reads or writes: its name and the reason, not Python's errno text
        raise SystemExit(f"error: {exc.filename or args.command}: {exc.strerror or exc}") from None
    except KeyboardInterrupt:
        print(f"chattts-velocity {args.command}: interrupted", file=sys.stderr)
        raise SystemExit(130) from None


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    main()
