"""Gradio web UI for chattts_velocity: text + voice settings in, 24 kHz speech (optionally streamed) out.

`chattts-velocity webui` (chattts_velocity/cli/webui.py) loads the model from its flags and serves this page;
`python webui/app.py FLAGS` from a source checkout runs that command.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, TypedDict, cast

if __name__ == "__main__":  # this checkout's package importable in the command, whatever the working folder
    _PATH = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")) if p)
    os.execve(sys.executable, [sys.executable, "-m", "chattts_velocity.cli", "webui", *sys.argv[1:]],
              {**os.environ, "PYTHONPATH": _PATH})

import gradio as gr

from chattts_velocity.schema import MAX_NEW_TOKEN
from chattts_velocity.speech import SpeechPipeline
from chattts_velocity.text.voices import PRESET_SEEDS, VoiceLibrary
from webui import layout
from webui.controls import DEFAULT_PRESET, Request, refine_prompt
from webui.handlers import FILES_TTL_S, MAX_RUN_CHARS, Handlers, ffmpeg_available, random_seed
from webui.layout import CSS, HIDDEN, THEME, Controls, pick
from webui.library import LibraryHandlers

REQUEST_INPUTS = tuple(f.name for f in dataclasses.fields(Request))  # the controls a run reads, in Request's order
RUN_STATE = ("generate", "generate_stream", "interrupt", "live")  # what a run's start and end switch
QUEUE_SIZE = 16  # runs waiting for the engine at most; one more is refused at once ("the queue is full")
# Auto-play in the browser: gradio reads a player's autoplay once, when it mounts, so the checkbox
# presses the player's Play button instead, once the new result has loaded (its duration shows): the
# player stops itself when loading ends, which would undo an earlier press.
PLAY_RESULT = """async (on) => {
  const pause = ms => new Promise(done => setTimeout(done, ms));
  for (let tries = 0; on && tries < 50; tries++, await pause(100)) {
    const player = document.querySelector('#output-audio');
    const button = player.querySelector('button.play-pause-button');
    const duration = player.querySelector('time#duration');
    if (button && duration && duration.textContent.trim() !== '0:00') {
      await pause(100);
      button.click();
      return;
    }
  }
}"""
Switches = tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]  # gr.update()s, RUN_STATE's order


class _Progress(TypedDict):  # a run's own event: its progress shows on the stats box
    show_progress: Literal["minimal"]
    show_progress_on: gr.Textbox


class _Switch(TypedDict):  # a run's start and end events
    queue: bool
    show_progress: Literal["hidden"]


def _running(streaming: bool) -> Switches:
    """Run start -> RUN_STATE: Generate off, Interrupt on, the live player shown for a stream."""
    off, on = gr.update(interactive=False), gr.update(interactive=True)
    return off, off, on, gr.update(elem_classes=[] if streaming else [HIDDEN])


def _stopped() -> Switches:
    on, off = gr.update(interactive=True), gr.update(interactive=False)
    return on, on, off, gr.update(elem_classes=[HIDDEN])


# Events that may answer with a toast go through the queue: gradio shows gr.Info / gr.Warning only there.
def _wire_voice(c: Controls, handlers: Handlers) -> None:
    c["preset"].change(handlers.voice_for_preset, c["preset"], [c["audio_seed"], c["speaker"]], queue=False)
    c["audio_dice"].click(random_seed, None, c["audio_seed"], queue=False)
    c["text_dice"].click(random_seed, None, c["text_seed"], queue=False)
    c["audio_seed"].change(handlers.speaker_for_seed, c["audio_seed"], [c["speaker"], c["preset"], c["stats"]])
    c["clip"].change(handlers.encode_clip, c["clip"], [c["clip_code"], c["stats"], c["clip"]])


def _wire_library(c: Controls, library: LibraryHandlers) -> None:
    voice = [c["speaker"], c["clip_code"], c["transcript"]]
    c["save_voice"].click(library.save, [c["voice_name"], *voice], [c["saved"], c["voice_name"], c["stats"]])
    c["saved"].input(library.pick, c["saved"], [*voice, c["preset"], c["audio_seed"], c["stats"]])  # a person's
    c["delete_voice"].click(library.delete, c["saved"], [c["saved"], c["stats"]])


def _wire_style(c: Controls) -> None:
    levels = [c["oral"], c["laugh"], c["pause"]]
    for slider in levels:
        slider.change(refine_prompt, levels, c["refine_prompt"], queue=False)
    refine_inputs = [*levels, c["refine_beams"]]
    c["refine"].change(lambda on: [gr.update(interactive=on)] * len(refine_inputs), c["refine"], refine_inputs,
                       queue=False)
    c["stream"].change(lambda on: (gr.update(visible=on), gr.update(visible=not on)), c["stream"],
                       [c["generate_stream"], c["generate"]], queue=False)


def _wire_runs(c: Controls, handlers: Handlers) -> None:
    # Two Generate buttons, so the live player is only an output of streaming runs. A streaming event
    # plays every audio output it sets, so a stream's full audio goes through a State into the player
    # after the event (and is not auto-played: the listener heard it live, and may still be hearing it).
    # The stats box is the one progress display: the handlers write elapsed time and audio made into it, and
    # gradio's own indicator (its timer only) shows on it alone, not on every output.
    # gradio hands each event its session (gr.Request): a run, its Interrupt and its files belong to it
    def generate(request: gr.Request, *values: Any) -> Iterator[tuple[object, ...]]:
        yield from handlers.generate(*values, session=request.session_hash or "")

    def generate_stream(request: gr.Request, *values: Any) -> Iterator[tuple[object, ...]]:
        yield from handlers.generate_stream(*values, session=request.session_hash or "")

    def interrupt(request: gr.Request) -> None:
        handlers.interrupt(request.session_hash or "")

    inputs = pick(c, REQUEST_INPUTS)
    results = pick(c, ("download", "refined", "stats"))
    state, streamed = pick(c, RUN_STATE), gr.State()
    # the stats box shows gradio's status: the queue position while a run waits, then its timer
    progress: _Progress = {"show_progress": "minimal", "show_progress_on": c["stats"]}
    # a run's start and end flip buttons and the live player
    switch: _Switch = {"queue": False, "show_progress": "hidden"}
    c["generate"].click(lambda: _running(False), None, state, **switch) \
        .then(generate, inputs, [c["audio"], *results], concurrency_id="tts", concurrency_limit=1,
              **progress) \
        .then(_stopped, None, state, **switch) \
        .then(None, c["autoplay"], None, js=PLAY_RESULT)
    c["generate_stream"].click(lambda: _running(True), None, state, **switch) \
        .then(generate_stream, inputs, [c["live"], streamed, *results], concurrency_id="tts",
              concurrency_limit=1, **progress) \
        .then(lambda audio: audio, streamed, c["audio"], queue=False) \
        .then(_stopped, None, state, **switch)
    c["interrupt"].click(interrupt, None, None, queue=False)


def build_ui(pipeline: SpeechPipeline, gpt: str = "velocity", max_new_token: int = MAX_NEW_TOKEN,
             voices: VoiceLibrary | None = None, demo_weights: bool = False, max_chars: int = MAX_RUN_CHARS,
             queue_size: int = QUEUE_SIZE, files_ttl_s: int = FILES_TTL_S) -> gr.Blocks:
    """The whole page around one speech pipeline (a loaded Chat's `.pipeline`; its runs on the GPT path `gpt`,
    "velocity" or "plain") and a voice library (default:
    $CHATTTS_VELOCITY_VOICES); demo_weights shows a notice that the audio is random. A run holds at most
    `max_chars` characters; at most `queue_size` runs wait for the engine (the page's queue is set up here:
    streaming needs it); files the page made (downloads, gradio's copies of the audio) are removed after
    `files_ttl_s`, a session's downloads also when it ends. Launch with launch(), or
    `.launch(theme=THEME, css=CSS)` (CSS hides the live player outside streaming runs); calling `.queue()` again
    would undo the queue's bound."""
    voices = voices or VoiceLibrary()
    handlers = Handlers(pipeline, gpt=gpt, max_new_token=max_new_token, voices=voices,
                        max_chars=max_chars, files_ttl_s=files_ttl_s)
    library = LibraryHandlers(voices, handlers.voice_check.fits)
    # gradio deletes the files it made for this page (the players' audio, the downloads' copies) once older than
    # files_ttl_s, looking every files_ttl_s / 4
    cleanup = (max(1, files_ttl_s // 4), files_ttl_s)
    demo = gr.Blocks(title="ChatTTS velocity", analytics_enabled=False, delete_cache=cleanup)
    with demo:
        gr.Markdown("## ChatTTS velocity\nType some Chinese or English text, pick a voice and press Generate.")
        if demo_weights:
            gr.Markdown(layout.DEMO_NOTICE, elem_id="demo-notice")
        with gr.Row():
            with gr.Column(scale=3, min_width=300):
                c = layout.primary_controls()
                examples_slot = gr.Column()  # filled below: examples need the controls they set
                preset_speaker = cast(str, handlers.speaker_for_seed(PRESET_SEEDS[DEFAULT_PRESET])[0])  # a valid seed
                c.update(layout.voice_controls(preset_speaker))
                c.update(layout.library_controls(library.names()))
                c.update(layout.style_controls())
                c.update(layout.run_controls(ffmpeg_available()))
            with gr.Column(scale=2, min_width=300):
                c.update(layout.output_controls())
        with examples_slot:
            gr.Examples([values for _, values in layout.EXAMPLES], pick(c, layout.EXAMPLE_INPUTS),
                        label="Examples (each sets speed, refine levels and seeds too)",
                        example_labels=[label for label, _ in layout.EXAMPLES])
        _wire_voice(c, handlers)
        _wire_library(c, library)
        _wire_style(c)
        demo.load(library.refresh, None, c["saved"], queue=False)  # voices saved elsewhere since start-up
        _wire_runs(c, handlers)

        def forget(request: gr.Request) -> None:  # the tab closed: its run stops and its downloads go
            handlers.forget(request.session_hash or "")

        demo.unload(forget)
    # one run at a time on the engine (the "tts" events' own limit); the rest wait in a bounded queue whose
    # position gradio shows on the waiting page's stats box
    demo.queue(default_concurrency_limit=1, max_size=queue_size)
    return demo


def launch(demo: gr.Blocks, host: str = "127.0.0.1", port: int = 7860, share: bool = False) -> None:
    """Serve the page until Ctrl-C, saying where it is."""
    # quiet: gradio's own banner tells a user to edit launch(); ours names the command's flags
    demo.launch(server_name=host, server_port=port, share=share, theme=THEME, css=CSS, quiet=True,
                        prevent_thread_lock=True)
    # gradio sets local_url (a str once launched) without annotating it, so it reads as None
    print(served_at(cast(str, demo.local_url), demo.share_url), flush=True)
    demo.block_thread()


def served_at(local_url: str, share_url: str | None) -> str:
    """Where the page is, and the flags that change who can reach it."""
    lines = [f"web UI on {local_url} (Ctrl-C stops it)"]
    if share_url:
        lines.append(f"public link: {share_url} (anyone with it can use the page)")
    else:
        lines.append("--share adds a public gradio.live link; --host 0.0.0.0 serves this network")
    return "\n".join(lines)
