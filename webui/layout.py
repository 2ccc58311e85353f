"""Web UI layout: the page's components, built inside the caller's gr.Blocks; app.py wires their events.

Each builder returns {name: component}; elem_ids are the names the browser tests drive. The primary controls
(text, voice preset, Generate) come first; everything else sits in collapsed groups, so Generate is on a phone's
first screen.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal, TypedDict, cast

import gradio as gr
from gradio.components import Component

from chattts_velocity.audio import SAMPLE_RATE
from chattts_velocity.audio.formats import WAV, available_formats
from chattts_velocity.params import SHARED_MAX_BEAMS
from chattts_velocity.text.voices import PRESET_SEEDS

from .controls import BATCH_SIZE, CUSTOM, DEFAULT_PRESET, LEVELS, refine_prompt


class Controls(TypedDict, total=False):
    """The page's components by name (each builder fills its own keys); typed so events (.click, .change) check."""

    text: gr.Textbox
    preset: gr.Dropdown
    generate: gr.Button
    generate_stream: gr.Button
    interrupt: gr.Button
    audio_seed: gr.Number
    audio_dice: gr.Button
    speaker: gr.Textbox
    clip: gr.Audio
    transcript: gr.Textbox
    clip_code: gr.Textbox
    saved: gr.Dropdown
    voice_name: gr.Textbox
    save_voice: gr.Button
    delete_voice: gr.Button
    speed: gr.Slider
    refine: gr.Checkbox
    oral: gr.Slider
    laugh: gr.Slider
    pause: gr.Slider
    refine_beams: gr.Slider
    refine_prompt: gr.Textbox
    text_seed: gr.Number
    text_dice: gr.Button
    split_text: gr.Checkbox
    stream: gr.Checkbox
    autoplay: gr.Checkbox
    batch_size: gr.Slider
    temperature: gr.Slider
    top_p: gr.Slider
    top_k: gr.Slider
    fmt: gr.Dropdown
    captions: gr.Dropdown
    live: gr.Audio
    audio: gr.Audio
    download: gr.File
    refined: gr.Textbox
    stats: gr.Textbox


def pick(c: Controls, names: Iterable[str]) -> list[Component]:
    """The components named (event inputs and outputs), in order."""
    by_name = cast(Mapping[str, Component], c)  # a TypedDict reads as Mapping[str, object] only
    return [by_name[name] for name in names]

HIDDEN = "velocity-hidden"
# Seed rows keep their Random button beside the box at any width; toasts sit at the bottom, clear of
# the controls near the top; on a phone the two columns stack and nothing overflows sideways.
CSS = f"""
.{HIDDEN} {{ display: none !important; }}
.seed-row {{ flex-wrap: nowrap !important; align-items: flex-end !important; }}
.seed-row > .form, .seed-row > div:first-child {{ min-width: 0 !important; flex: 1 1 auto !important; }}
.seed-row > button {{ flex: 0 0 auto !important; min-width: max-content !important; }}
.toast-wrap {{ top: auto !important; bottom: 12px !important; }}
#download .empty {{ min-height: 64px !important; height: 64px !important; }}
@media (max-width: 560px) {{ .stack-on-phone {{ flex-direction: column !important; }}
  .stack-on-phone > * {{ min-width: 100% !important; }} }}
"""
THEME = gr.themes.Default(font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])
_SPEED, _ORAL, _LAUGH, _BREAK = (LEVELS[k] for k in ("speed", "oral", "laugh", "break"))

# (label, [text, speed, oral, laugh, break, audio seed, text seed]): an example sets every one of them.
EXAMPLES = [
    ("今天天气真不错 (mixed zh/en, speed 4, seed 2)",
     ["今天天气真不错，我们去公园走走吧。The weather is lovely today, so let's take a walk.",
      4, 2, 0, 6, 2, 42]),
    ("Speech synthesis turns (slow narration, seed 1111)",
     ["Speech synthesis turns written words into a voice [uv_break] that anyone can listen to.",
      3, 0, 0, 4, 1111, 7]),
    ("欢迎使用这个语音合成引擎 (chatty, laughs, speed 7)",
     ["欢迎使用这个语音合成引擎 [laugh]，它可以同时为很多用户服务。", 7, 6, 2, 5, 3333, 42]),
]
EXAMPLE_INPUTS = ("text", "speed", "oral", "laugh", "pause", "audio_seed", "text_seed")
DEMO_NOTICE = ("**Demo weights: random audio.** These random weights make noise, and the refined text is "
               "gibberish; start the page with `--model DIR` on the official files (models/README.md) for speech.")


def _seed_row(value: int, label: str, button: str, box_id: str, button_id: str) -> tuple[gr.Number, gr.Button]:
    with gr.Row(elem_classes=["seed-row"]):
        box = gr.Number(value, precision=0, label=label, elem_id=box_id)
        dice = gr.Button(button, size="md", scale=0, elem_id=button_id)
    return box, dice


def primary_controls() -> Controls:
    """Text, voice preset, Generate / Interrupt: what a first run needs."""
    c: Controls = {}
    c["text"] = gr.Textbox(label="Text", lines=4, max_lines=12, elem_id="input-text",
                           placeholder="Text to speak (Chinese and/or English)")
    c["preset"] = gr.Dropdown([*PRESET_SEEDS, CUSTOM], value=DEFAULT_PRESET, label="Voice preset",
                              info="a bookmark for an audio seed; Custom for any other seed", elem_id="voice-preset")
    with gr.Row():
        c["generate"] = gr.Button("Generate", variant="primary", elem_id="generate")
        c["generate_stream"] = gr.Button("Generate", variant="primary", visible=False, elem_id="generate-stream")
        c["interrupt"] = gr.Button("Interrupt", variant="stop", interactive=False, elem_id="interrupt")
    return c


def voice_controls(default_speaker: str) -> Controls:
    c: Controls = {}
    with gr.Accordion("Voice: seed, speaker string, cloning", open=False, elem_id="group-voice"):
        c["audio_seed"], c["audio_dice"] = _seed_row(PRESET_SEEDS[DEFAULT_PRESET], "Audio seed (voice)",
                                                     "🎲 Random voice", "audio-seed", "audio-dice")
        c["speaker"] = gr.Textbox(default_speaker, label="Speaker string", lines=2, max_lines=4, buttons=["copy"],
                                  info="made from the audio seed; paste one to reuse a voice, clear it for the "
                                       "model's default voice", elem_id="speaker")
        with gr.Accordion("Clone a voice (optional)", open=False, elem_id="group-clone"):
            c["clip"] = gr.Audio(sources=["upload", "microphone"], type="filepath", buttons=[], elem_id="clip",
                                 label="Voice clip: upload or record (any rate; mixed to mono)")
            c["transcript"] = gr.Textbox(label="Clip transcript", placeholder="the words spoken in the clip",
                                         elem_id="transcript")
            c["clip_code"] = gr.Textbox(label="Clip code (spk_smp)", lines=2, max_lines=4, buttons=["copy"],
                                        info="filled from the clip; a clip code wins over the speaker string",
                                        elem_id="clip-code")
    return c


def library_controls(names: list[str]) -> Controls:
    c: Controls = {}
    with gr.Accordion("Voice library", open=False, elem_id="group-library"):
        c["saved"] = gr.Dropdown(names, value=None, label="Saved voices", info="picking one fills the voice fields",
                                 elem_id="saved-voices")
        c["voice_name"] = gr.Textbox(label="Name", placeholder="a name for the current voice",
                                     elem_id="voice-name")
        with gr.Row():
            c["save_voice"] = gr.Button("Save current voice", size="md", elem_id="save-voice")
            c["delete_voice"] = gr.Button("Delete picked voice", size="md", variant="stop",
                                          elem_id="delete-voice")
    return c


def style_controls() -> Controls:
    c: Controls = {}
    with gr.Accordion("Speed and refine", open=False, elem_id="group-style"):
        c["speed"] = gr.Slider(0, _SPEED[0], _SPEED[1], step=1, label="Speed", info="[speed_N]: 0 slow, 9 fast",
                               elem_id="speed")
        c["refine"] = gr.Checkbox(True, label="Refine text", info="the model rewrites the text first, adding "
                                  "pauses and laughs by these levels", elem_id="refine")
        with gr.Row(elem_classes=["stack-on-phone"]):
            c["oral"] = gr.Slider(0, _ORAL[0], _ORAL[1], step=1, label="Oral", elem_id="oral")
            c["laugh"] = gr.Slider(0, _LAUGH[0], _LAUGH[1], step=1, label="Laugh", elem_id="laugh")
            c["pause"] = gr.Slider(0, _BREAK[0], _BREAK[1], step=1, label="Break", elem_id="break")
        c["refine_beams"] = gr.Slider(1, SHARED_MAX_BEAMS, 1, step=1, label="Refine beams", elem_id="refine-beams",
                                      info="1 samples the refined text (by the text seed); more searches that many "
                                           "beams for the most likely one")
        c["refine_prompt"] = gr.Textbox(refine_prompt(_ORAL[1], _LAUGH[1], _BREAK[1]), label="Refine prompt",
                                        interactive=False, elem_id="refine-prompt")
        c["text_seed"], c["text_dice"] = _seed_row(42, "Text seed (refine)", "🎲 Random seed", "text-seed",
                                                   "text-dice")
    return c


def run_controls(can_stream: bool) -> Controls:
    c: Controls = {}
    with gr.Accordion("Options: stream, long text, sampling, format", open=False,
                      elem_id="group-options"):
        with gr.Row(elem_classes=["stack-on-phone"]):
            c["split_text"] = gr.Checkbox(True, label="Split long text", info="sentence pieces, batched",
                                          elem_id="split-text")
            c["stream"] = gr.Checkbox(False, label="Stream", interactive=can_stream, elem_id="stream",
                                      info="play while generating" if can_stream
                                      else "streaming needs ffmpeg on the server")
            c["autoplay"] = gr.Checkbox(True, label="Auto-play",
                                        info="play the result when it is ready (not after a stream)",
                                        elem_id="autoplay")
        c["batch_size"] = gr.Slider(*BATCH_SIZE, step=1, label="Batch size", info="pieces generated together",
                                    elem_id="batch-size")
        c["temperature"] = gr.Slider(1e-5, 1.0, 0.3, step=1e-5, label="Temperature", elem_id="temperature")
        c["top_p"] = gr.Slider(0.1, 1.0, 0.7, step=0.05, label="top_P", elem_id="top-p")
        c["top_k"] = gr.Slider(1, 20, 20, step=1, label="top_K", elem_id="top-k")
        c["fmt"] = gr.Dropdown(list(available_formats()), value=WAV.name, label="Download format",
                               elem_id="format")
        c["captions"] = gr.Dropdown(["none", "srt", "vtt"], value="none", label="Captions",
                                    info="a subtitle file of the sentences beside the download", elem_id="captions")
    return c


def output_controls() -> Controls:
    c: Controls = {}
    # Players show a download button only (gradio 6 adds a Spaces share button by default). The live
    # player is hidden with CSS, not visible=False: a player mounted just before its first stream missed it.
    c["live"] = gr.Audio(label="Live stream", streaming=True, autoplay=True, interactive=False,
                         buttons=["download"], elem_id="live-audio", elem_classes=[HIDDEN])
    c["audio"] = gr.Audio(label=f"Audio ({SAMPLE_RATE // 1000} kHz {WAV.name.upper()})", type="numpy",
                          format=cast(Literal["wav"], WAV.name), interactive=False, buttons=["download"],
                          elem_id="output-audio")
    c["download"] = gr.File(label="Download (the chosen format, and the captions when asked)", interactive=False,
                            elem_id="download")
    c["refined"] = gr.Textbox(label="Spoken text (after refine)", lines=2, interactive=False, elem_id="refined")
    c["stats"] = gr.Textbox(label="Run stats", lines=5, interactive=False, elem_id="stats")
    return c
