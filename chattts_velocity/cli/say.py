"""`chattts-velocity say`: one text (or script) to a WAV file, optionally with its captions beside it."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from ..audio.captions import CAPTION_FORMATS, captions, check_captions
from ..audio.wav import SAMPLE_RATE
from ..text.script import parse_script
from ..text.voices import VoiceFields, VoiceLibrary, voice_params
from .common import check_writable, load_chat, max_new_token


def add_say_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", help="the text to speak (Chinese and/or English); [voice: NAME] and [pause: 1.5s] tags "
                                "make it a script (docs/voices.md)")
    p.add_argument("-o", "--output", required=True, metavar="FILE.wav",
                   help="the WAV file to write (its folder must exist)")
    p.add_argument("--voice", default=None,
                   help="the voice, as the server takes it: a preset name, an integer seed, a saved voice, a speaker "
                        "string, or a blend such as 'alloy(2)+1234(1)'")
    p.add_argument("--speaker", default="", help="speaker string from sample_random_speaker() (or any --voice)")
    p.add_argument("--voices", metavar="DIR", default=None,
                   help="the voice library folder (default $CHATTTS_VELOCITY_VOICES or "
                        "~/.cache/chattts_velocity/voices)")
    p.add_argument("--captions", choices=CAPTION_FORMATS, default=None,
                   help="also write the sentence captions beside the WAV (FILE.srt or FILE.vtt)")
    p.add_argument("--refine", action="store_true", help="run the refine-text pass first")
    p.add_argument("--plain", action="store_true", help="use the plain transformers path")


def cmd_say(args: argparse.Namespace) -> None:
    from ..audio import write_wav
    from ..speech.script_audio import plain_script, speak_script, turn_params

    if not args.text.strip():
        raise ValueError("text: empty; give the words to say, e.g. chattts-velocity say \"Hello.\" -o hello.wav")
    out = Path(args.output)
    if not out.parent.is_dir() or out.is_dir():
        raise ValueError(f"--output: {out} cannot be written (is {out.parent} an existing folder?); nothing was "
                         "synthesised")
    check_writable(out, "--output")
    fmt = check_captions(args.captions, "--captions")
    script = parse_script(args.text, SAMPLE_RATE, field="text")  # a bad tag fails before the model loads
    if args.voice is not None and args.speaker:
        raise ValueError("--voice: given with --speaker; choose one")
    chat = load_chat(args, use_vllm=not args.plain)
    library = VoiceLibrary(args.voices)
    flag = "--voice" if args.voice is not None else "--speaker"
    fields = _voice(args.voice or args.speaker or None, library, chat.pipeline.speakers.random, flag)
    params = chat.InferCodeParams(manual_seed=args.seed, max_new_token=max_new_token(args), **fields)
    if script is None and fmt is None:
        wav = chat.infer(args.text, skip_refine_text=not args.refine, params_infer_code=params)[0]
    else:
        script = script or plain_script(args.text)
        turns = turn_params(script, params, lambda v: voice_params(v, library, chat.pipeline.speakers.random),
                            field="text")
        spoken = speak_script(chat.pipeline, script, turns, refine=chat.RefineTextParams() if args.refine else None)
        wav = spoken.wav
        if fmt is not None:
            out.with_suffix(f".{fmt}").write_text(captions(spoken.timestamps, fmt), encoding="utf-8")
    write_wav(args.output, wav)
    print(f"wrote {args.output} ({len(wav) / SAMPLE_RATE:.2f} s of audio)"
          + (f" and {out.with_suffix(f'.{fmt}')}" if fmt else ""))


def _voice(voice: str | None, library: VoiceLibrary, draw: Callable[[int], str], flag: str) -> VoiceFields:
    """--voice / --speaker as InferCodeParams keywords (none given: the model's own default); errors name `flag`."""
    if voice is None:
        return {"spk_emb": None, "spk_smp": None, "txt_smp": None}
    try:
        return voice_params(voice, library, draw)
    except ValueError as exc:
        raise ValueError(f"{flag}: {str(exc).split(': ', 1)[-1]}") from None
