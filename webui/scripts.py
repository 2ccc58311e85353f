"""Web UI runs of a script ([voice: NAME] / [pause: 1.5s] tags) or with captions: the turns spoken in one batch and
joined with their silences (speech/script_audio.py), the caption file offered beside the audio download.

Such a run is generated whole and then played (also with Stream on): its turns are one batch, and its captions
need every piece's span.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import gradio as gr
import numpy as np

from chattts_velocity import InferCodeParams, RefineTextParams
from chattts_velocity.audio import SAMPLE_RATE, Spoken
from chattts_velocity.audio.captions import captions, check_captions
from chattts_velocity.params import SHARED_MAX_BEAMS
from chattts_velocity.speech import SpeechPipeline
from chattts_velocity.speech.script_audio import plain_script, speak_script, turn_params
from chattts_velocity.text.script import Script, parse_script
from chattts_velocity.text.voices import check_voice_seed, voice_params

from .clips import RunStats
from .controls import Request, check_seed, refine_prompt, whole
from .sessions import Run
from .voice_check import VoiceCheck
from .worker import RunOptions, Update, Wait

NO_CAPTIONS = "none"
CAPTION_CHOICES = (NO_CAPTIONS, "srt", "vtt")


def page_script(r: Request) -> Script | None:
    """The run as a script: its tags', or its whole text as one turn when captions are asked; None for a plain run."""
    fmt = check_captions(None if r.captions == NO_CAPTIONS else r.captions, "captions")
    script = parse_script(r.text, SAMPLE_RATE, field="text")
    return script if script is not None or fmt is None else plain_script(r.text)


class ScriptRuns:
    """Handlers' script and captions runs (a mixin: the page's pipeline, voices, waiting and results are theirs)."""

    pipeline: SpeechPipeline
    voice_check: VoiceCheck
    gpt: str
    _wait: Wait
    _results: Callable[[np.ndarray, str, Run], tuple[object, str]]
    _final: Callable[[RunStats, Run], str]

    def _script_run(self, r: Request, script: Script, params: InferCodeParams, options: RunOptions,
                    stats: RunStats, run: Run) -> Iterator[Update]:
        """-> the page's updates (live, audio, download, spoken text, stats) for a script or captions run."""
        skip = gr.skip()
        refine = refine_params(r) if r.refine else None
        turns = turn_params(script, params, lambda voice: voice_params(voice, self.voice_check.voices,
                                                                       self._speaker_for_seed), field="text")
        spoken: Spoken = yield from self._wait(
            lambda: speak_script(self.pipeline, script, turns, refine=refine, gpt=self.gpt,
                                 stop=options["stop"].is_set), stats, "generating", options["stop"])
        stats.add(len(spoken.wav), time.perf_counter())
        stats.end = time.perf_counter()
        audio, download = self._results(spoken.wav, r.fmt, run)
        files: str | list[str] = download
        if r.captions != NO_CAPTIONS:
            cues = Path(download).with_suffix(f".{r.captions}")
            cues.write_text(captions(spoken.timestamps, r.captions), encoding="utf-8")
            files = [download, str(cues)]
        yield skip, audio, files, "\n".join(stamp.text for stamp in spoken.timestamps), self._final(stats, run)

    def _speaker_for_seed(self, seed: int) -> str:
        return self.pipeline.speakers.random(seed=check_voice_seed(seed))


def refine_params(r: Request) -> RefineTextParams:
    """The page's refine controls (the same sliders as the code pass, as in the upstream web UI: users compare
    the two): a run's refine pass, and each turn's in a script run."""
    return RefineTextParams(prompt=refine_prompt(r.oral, r.laugh, r.pause), temperature=float(r.temperature),
                            top_P=float(r.top_p), top_K=int(r.top_k), manual_seed=check_seed(r.text_seed, "text seed"),
                            show_tqdm=False, beam_width=whole(r.refine_beams, "refine beams", 1, SHARED_MAX_BEAMS))
