"""Gradio web UI for chattts_velocity: text + voice settings in, 24 kHz speech (optionally streamed) out.

    python webui/app.py --model DIR|demo [--tiny] [--host 127.0.0.1] [--port 7860] [--plain]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python webui/app.py` from a source checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gradio as gr

from chattts_velocity import Chat
from chattts_velocity.audio import SAMPLE_RATE
from chattts_velocity.audio.formats import WAV
from chattts_velocity.cli.common import add_webui_flags, check_port_free, load_chat
from webui.handlers import VOICE_PRESETS, Handlers, ffmpeg_available, random_seed

EXAMPLES = [
    ["今天天气真不错，我们去公园走走吧。The weather is lovely today, so let's take a walk."],
    ["Speech synthesis turns written words into a voice [uv_break] that anyone can listen to."],
    ["欢迎使用这个语音合成引擎 [laugh]，它可以同时为很多用户服务。"],
]
HIDDEN = "velocity-hidden"
CSS = f".{HIDDEN} {{ display: none !important; }}"
THEME = gr.themes.Default(font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])


def _voice_controls(handlers: Handlers) -> dict[str, gr.components.Component]:
    c: dict[str, gr.components.Component] = {}
    with gr.Row():
        c["preset"] = gr.Dropdown(list(VOICE_PRESETS), value="Default", label="Voice preset", scale=2,
                                  elem_id="voice-preset")
        c["audio_seed"] = gr.Number(VOICE_PRESETS["Default"], precision=0, label="Audio seed", scale=2,
                                    elem_id="audio-seed")
        c["audio_dice"] = gr.Button("🎲", scale=0, min_width=48, elem_id="audio-dice")
        c["text_seed"] = gr.Number(42, precision=0, label="Text seed (refine)", scale=2, elem_id="text-seed")
        c["text_dice"] = gr.Button("🎲", scale=0, min_width=48)
    c["speaker"] = gr.Textbox(handlers.speaker_for_seed(VOICE_PRESETS["Default"]), label="Speaker string",
                              info="made from the audio seed; paste one to reuse a voice, clear it for the "
                                   "model's default voice", lines=2, max_lines=4, buttons=["copy"],
                              elem_id="speaker")
    with gr.Accordion("Clone a voice (optional)", open=False):
        c["clip"] = gr.Audio(sources=["upload"], type="filepath", label="Voice clip (any rate; mixed to mono)",
                             buttons=[], elem_id="clip")
        c["transcript"] = gr.Textbox(label="Clip transcript", placeholder="the words spoken in the clip",
                                     elem_id="transcript")
        c["clip_code"] = gr.Textbox(label="Clip code (spk_smp)", lines=2, max_lines=4, buttons=["copy"],
                                    info="filled from the clip; a clip code wins over the speaker string",
                                    elem_id="clip-code")
    return c


def _sampling_controls() -> dict[str, gr.components.Component]:
    c: dict[str, gr.components.Component] = {}
    with gr.Row():
        c["refine"] = gr.Checkbox(True, label="Refine text", info="add pauses and laughs before speaking",
                                  elem_id="refine")
        c["stream"] = gr.Checkbox(False, label="Stream", interactive=ffmpeg_available(), elem_id="stream",
                                  info="play while generating" if ffmpeg_available()
                                  else "streaming needs ffmpeg on the server")
    c["temperature"] = gr.Slider(1e-5, 1.0, 0.3, step=1e-5, label="Temperature")
    c["top_p"] = gr.Slider(0.1, 1.0, 0.7, step=0.05, label="top_P")
    c["top_k"] = gr.Slider(1, 20, 20, step=1, label="top_K")
    return c


def _output_controls() -> dict[str, gr.components.Component]:
    c: dict[str, gr.components.Component] = {}
    # Players show a download button only (gradio 6 adds a Spaces share button by default).
    c["live"] = gr.Audio(label="Live stream", streaming=True, autoplay=True, interactive=False,
                         buttons=["download"], elem_id="live-audio", elem_classes=[HIDDEN])
    c["audio"] = gr.Audio(label=f"Audio ({SAMPLE_RATE // 1000} kHz {WAV.name.upper()})", type="numpy",
                          format=WAV.name, interactive=False, buttons=["download"], elem_id="output-audio")
    c["refined"] = gr.Textbox(label="Spoken text (after refine)", lines=2, interactive=False, elem_id="refined")
    c["stats"] = gr.Textbox(label="Run stats", lines=5, interactive=False, elem_id="stats")
    return c


def _stream_toggled(on: bool) -> tuple[dict, dict, dict]:
    return gr.update(elem_classes=[] if on else [HIDDEN]), gr.update(visible=on), gr.update(visible=not on)


def _wire(c: dict[str, gr.components.Component], handlers: Handlers) -> None:
    c["preset"].change(lambda name: VOICE_PRESETS.get(name, 2), c["preset"], c["audio_seed"], queue=False)
    c["audio_dice"].click(random_seed, None, c["audio_seed"], queue=False)
    c["text_dice"].click(random_seed, None, c["text_seed"], queue=False)
    c["audio_seed"].change(handlers.speaker_for_seed, c["audio_seed"], c["speaker"], queue=False)
    c["clip"].change(handlers.encode_clip, c["clip"], c["clip_code"])
    # Two Generate buttons, so the live player is only an output of streaming runs. The player is
    # hidden with CSS, not visible=False: a player mounted just before its first stream missed it.
    c["stream"].change(_stream_toggled, c["stream"], [c["live"], c["generate_stream"], c["generate"]],
                       queue=False)
    inputs = [c[k] for k in ("text", "speaker", "clip_code", "transcript", "refine", "text_seed",
                             "audio_seed", "temperature", "top_p", "top_k")]
    outputs = [c[k] for k in ("audio", "refined", "stats")]
    c["generate"].click(handlers.generate, inputs, outputs, concurrency_id="tts", concurrency_limit=1)
    c["generate_stream"].click(handlers.generate_stream, inputs, [c["live"], *outputs],
                                concurrency_id="tts", concurrency_limit=1)
    c["interrupt"].click(handlers.interrupt, None, None, queue=False)


def build_ui(chat: Chat, use_vllm: bool = True, max_new_token: int = 2048) -> gr.Blocks:
    """The whole page around one loaded Chat. Launch with `.queue().launch(theme=THEME, css=CSS)`:
    streaming needs the queue, and CSS hides the live player until Stream is on."""
    handlers = Handlers(chat, use_vllm=use_vllm, max_new_token=max_new_token)
    with gr.Blocks(title="ChatTTS velocity", analytics_enabled=False) as demo:
        gr.Markdown("## ChatTTS velocity\nType some Chinese or English text, pick a voice and press Generate.")
        with gr.Row():
            with gr.Column(scale=3):
                text = gr.Textbox(label="Text", lines=5, max_lines=12, elem_id="input-text",
                                  placeholder="Text to speak (Chinese and/or English)")
                gr.Examples(EXAMPLES, inputs=[text], label="Examples")
                c = {"text": text, **_voice_controls(handlers)}
            with gr.Column(scale=2):
                c.update(_sampling_controls())
                with gr.Row():
                    c["generate"] = gr.Button("Generate", variant="primary", elem_id="generate")
                    c["generate_stream"] = gr.Button("Generate", variant="primary", visible=False,
                                                     elem_id="generate-stream")
                    c["interrupt"] = gr.Button("Interrupt", variant="stop", elem_id="interrupt")
                c.update(_output_controls())
        _wire(c, handlers)
    return demo


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="webui", description="chattts_velocity Gradio web UI")
    add_webui_flags(p)  # the same flags as `chattts-velocity webui`
    return p


def serve(args: argparse.Namespace) -> None:
    """Load the model and serve the UI until Ctrl-C; args from add_webui_flags (here or `chattts-velocity webui`)."""
    try:
        check_port_free(args.host, args.port)
        chat = load_chat(args, use_vllm=not args.plain)
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"error: {exc}") from None
    demo = build_ui(chat, use_vllm=not args.plain, max_new_token=args.max_new_token)
    demo.queue().launch(server_name=args.host, server_port=args.port, share=args.share, theme=THEME, css=CSS)


def main(argv: list[str] | None = None) -> None:
    serve(build_parser().parse_args(argv))


if __name__ == "__main__":
    main()
