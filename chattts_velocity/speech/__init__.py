"""Speech: the pipeline built once (text front end, GPT backends, mel sources) and streaming on top of it.

pipeline.py holds SpeechPipeline (what Chat, the server, the export and the web UI share) and its use cases
(`synthesis(job)`: a SynthesisJob, job.py, with its verbs run / stream / arun / astream / cancel, synthesis.py;
`run`, `stream` and `run_each`); prepare.py the one preparation of a job (pieces, refine,
step caps, code requests) that `run`/`stream` and the server drive; frontend.py the text front end; mel_source.py the
mel sources; streams.py the shared streaming pieces (StreamOptions, StreamSet). The server's SpeechService, built on
these, lives in serve/service.py.
"""
from chattts_velocity.speech.frontend import SpeakerPrompt, TextFrontEnd
from chattts_velocity.speech.job import SynthesisJob, TextOptions
from chattts_velocity.speech.mel_source import MEL_SOURCES, DecoderSource, DVAESource, MelSource
from chattts_velocity.speech.pipeline import SpeechPipeline
from chattts_velocity.speech.prepare import PreparedJob, TextGeneration
from chattts_velocity.speech.streams import EMPTY, StreamOptions, StreamSet, stream_texts
from chattts_velocity.speech.synthesis import Synthesis

__all__ = ["EMPTY", "MEL_SOURCES", "DVAESource", "DecoderSource", "MelSource", "PreparedJob", "SpeakerPrompt",
           "SpeechPipeline", "StreamOptions", "StreamSet", "Synthesis", "SynthesisJob", "TextFrontEnd",
           "TextGeneration", "TextOptions", "stream_texts"]
