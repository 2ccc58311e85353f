"""The server driven by voice-agent frameworks' own classes with their default settings (tiny random weights,
loopback): openai-agents' OpenAITTSModel, pipecat's OpenAITTSService.run_tts, LiveKit's openai TTS.synthesize and
the openai client's with_streaming_response. Each gets 24 kHz mono 16-bit audio of the clip's exact length, and its
first chunk while the engine is still generating the clip: every clip here is held to STEPS code steps, and one
sentence is one engine request, so "not finished yet" is the engine's finished count not having moved."""
from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")
pytest.importorskip("av")

import test_openai_server as openai_server  # noqa: E402 (after the importorskips)

from chattts_velocity.audio import SAMPLE_RATE, samples_for_steps  # noqa: E402 (after the importorskips)
from chattts_velocity.serve import ServerConfig, create_app  # noqa: E402 (after the importorskips)

pytestmark = pytest.mark.e2e

KEY = "frameworks-key"  # each framework sends it as OpenAI's Bearer key
STEPS = 400  # 8 s of audio; the first chunk is due after 28 steps
TEXT = "Hello from a voice agent."  # one sentence piece: one engine request
MP3_SLACK = 2 * 1152 + 576  # an MP3 decoder's extra samples from a stream without a LAME length tag


@pytest.fixture(scope="module")
def server(tiny_assets, tmp_path_factory) -> Iterator[openai_server.Server]:
    config = ServerConfig(max_new_token=STEPS, cache_mb=0, voices_dir=str(tmp_path_factory.mktemp("voices")),
                          api_key=KEY)
    app = create_app(lambda: openai_server._tiny_chat(tiny_assets), config)
    uv, thread, url = openai_server._serve(app)
    state = app.state.server
    speech = state.speech

    def exactly_steps(body):  # every clip exactly STEPS steps long, whatever the random weights sample
        plan, params, kind = speech(body)
        params.min_new_token = STEPS
        return plan, params, kind

    state.speech = exactly_steps
    try:
        yield openai_server.Server(url, state)
    finally:
        uv.should_exit = True
        thread.join(60)


class Clip:
    """Whether the clip's engine request was still running when its first chunk reached the client."""

    def __init__(self, server: openai_server.Server) -> None:
        self.stats = server.state.engine.stats
        self.finished_before = self.stats.num_finished
        self.running_at_first_chunk: bool | None = None

    def chunk(self) -> None:
        if self.running_at_first_chunk is None:
            self.running_at_first_chunk = self.stats.num_finished == self.finished_before

    def check(self) -> None:
        assert self.running_at_first_chunk is True, "the first chunk came only once the clip was finished"
        assert self.stats.num_finished == self.finished_before + 1  # and the clip did finish, as one request


def test_openai_agents_tts_model_with_its_default_settings(server: openai_server.Server) -> None:
    voice = pytest.importorskip("agents.voice")

    async def run() -> bytes:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
        model = voice.OpenAITTSModel("gpt-4o-mini-tts", client)  # what OpenAIVoiceModelProvider makes by default
        settings = voice.TTSModelSettings()  # its instructions: "You will receive partial sentences. ..."
        chunks = []
        async for chunk in model.run(TEXT, settings):
            clip.chunk()
            chunks.append(chunk)
        return b"".join(chunks)

    clip = Clip(server)
    pcm = asyncio.run(run())
    clip.check()
    assert len(pcm) == 2 * samples_for_steps(STEPS)  # s16le at 24 kHz: 2 bytes per sample of the clip


def test_pipecat_openai_tts_service_run_tts(server: openai_server.Server) -> None:
    pytest.importorskip("pipecat")
    from pipecat.clocks.system_clock import SystemClock
    from pipecat.frames.frames import ErrorFrame, TTSAudioRawFrame
    from pipecat.processors.frame_processor import FrameProcessorSetup
    from pipecat.services.openai.tts import OpenAITTSService
    from pipecat.utils.asyncio.task_manager import TaskManager

    async def run() -> list:
        service = OpenAITTSService(api_key=KEY, base_url=server.url + "/v1")  # defaults: gpt-4o-mini-tts, alloy
        setup = FrameProcessorSetup(clock=SystemClock(), task_manager=TaskManager(loop=asyncio.get_running_loop()),
                                    pipeline_worker=None)  # what a pipeline gives it (its output rate: 24 kHz)
        await service.setup(setup)
        frames = []
        async for frame in service.run_tts(TEXT, "context-1"):
            clip.chunk()
            frames.append(frame)
        return frames

    clip = Clip(server)
    frames = asyncio.run(run())
    clip.check()
    assert not [f for f in frames if isinstance(f, ErrorFrame)]
    audio = [f for f in frames if isinstance(f, TTSAudioRawFrame)]
    assert len(audio) >= 2 and {(f.sample_rate, f.num_channels) for f in audio} == {(SAMPLE_RATE, 1)}
    assert sum(len(f.audio) for f in audio) == 2 * samples_for_steps(STEPS)


def test_pipecat_raises_on_a_401_rather_than_yielding_an_error_frame(server: openai_server.Server) -> None:
    """What docs/serving.md's recipe warns about: a wrong key is an exception out of run_tts."""
    pytest.importorskip("pipecat")
    from pipecat.clocks.system_clock import SystemClock
    from pipecat.processors.frame_processor import FrameProcessorSetup
    from pipecat.services.openai.tts import OpenAITTSService
    from pipecat.utils.asyncio.task_manager import TaskManager

    async def run() -> None:
        service = OpenAITTSService(api_key="wrong", base_url=server.url + "/v1")
        await service.setup(FrameProcessorSetup(clock=SystemClock(), pipeline_worker=None,
                                                task_manager=TaskManager(loop=asyncio.get_running_loop())))
        async for _ in service.run_tts(TEXT, "context-2"):
            pass

    with pytest.raises(openai.AuthenticationError):
        asyncio.run(run())


@pytest.mark.parametrize("model", ["gpt-4o-mini-tts", "tts-1"])  # SSE events for the first, raw bytes for tts-1
def test_livekit_openai_tts_synthesize(server: openai_server.Server, model: str) -> None:
    pytest.importorskip("livekit.plugins.openai")
    from livekit.agents.utils import http_context
    from livekit.plugins import openai as livekit_openai

    async def run() -> list:
        async with http_context.open():  # no room, no worker: the plugin's HTTP session only
            tts = livekit_openai.TTS(base_url=server.url + "/v1", api_key=KEY, model=model)  # mp3, voice ash
            try:
                audio = []
                async for synthesized in tts.synthesize(TEXT):
                    clip.chunk()
                    audio.append(synthesized)
                return audio
            finally:
                await tts.aclose()

    clip = Clip(server)
    audio = asyncio.run(run())
    clip.check()
    frames = [a.frame for a in audio]
    assert {(f.sample_rate, f.num_channels) for f in frames} == {(SAMPLE_RATE, 1)}
    samples = sum(f.samples_per_channel for f in frames)
    assert 0 <= samples - samples_for_steps(STEPS) <= MP3_SLACK, samples
    assert {a.request_id for a in audio} != {""}  # the server's x-request-id reached the plugin


def test_openai_client_with_streaming_response(server: openai_server.Server) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=300)
    clip = Clip(server)
    chunks = []
    with client.audio.speech.with_streaming_response.create(model="gpt-4o-mini-tts", voice="marin", input=TEXT,
                                                             response_format="pcm",
                                                             extra_headers={"x-request-id": "mine-1"}) as response:
        assert response.headers["x-request-id"] == "mine-1" and "content-length" not in response.headers
        for chunk in response.iter_bytes():
            clip.chunk()
            chunks.append(chunk)
    clip.check()
    assert len(chunks) >= 2 and len(b"".join(chunks)) == 2 * samples_for_steps(STEPS)
