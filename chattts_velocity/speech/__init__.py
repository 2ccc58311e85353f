"""Speech: one job, its verbs, and the stages it runs through.

job.py holds SynthesisJob (texts, params, mel source, refine, shape, flow control); synthesis.py the job bound to a
pipeline and a runner (`Synthesis`: run / stream / arun / astream / open / each / cancel; run is the stream
collected); local_runner.py the runner on the pipeline's own GPT backend, one call at a time (the server's engine
runner is serve/engine_runner.py); pipeline.py SpeechPipeline (the use cases: synthesis, speakers, interrupt,
shutdown); stages.py the stages built once and the steps between them (what runners and Chat's low-level upstream
steps use); prepare.py the one preparation of a job (pieces, refine, step caps, code requests); frontend.py the
text front end; speakers.py voices; mel_source.py the mel sources; streams.py the shared streaming pieces
(StreamOptions, StreamSet).
"""
from chattts_velocity.speech.frontend import SpeakerPrompt, TextFrontEnd
from chattts_velocity.speech.job import GPT_PATHS, SynthesisJob, TextOptions
from chattts_velocity.speech.local_runner import LocalRunner
from chattts_velocity.speech.mel_source import MEL_SOURCES, DecoderSource, DVAESource, MelSource
from chattts_velocity.speech.pipeline import SpeechPipeline
from chattts_velocity.speech.prepare import PreparedJob, TextGeneration
from chattts_velocity.speech.speakers import Speakers
from chattts_velocity.speech.stages import Stages
from chattts_velocity.speech.streams import EMPTY, StreamOptions, StreamSet, stream_texts
from chattts_velocity.speech.synthesis import AudioStream, Runner, Synthesis

__all__ = ["EMPTY", "GPT_PATHS", "MEL_SOURCES", "AudioStream", "DVAESource", "DecoderSource", "LocalRunner",
           "MelSource", "PreparedJob", "Runner", "SpeakerPrompt", "Speakers", "SpeechPipeline", "Stages",
           "StreamOptions", "StreamSet", "Synthesis", "SynthesisJob", "TextFrontEnd", "TextGeneration", "TextOptions",
           "stream_texts"]
