"""Web UI: the voice fields -> what the pipeline takes, checked as the server checks them.

Generate and Save both go through `VoiceCheck`: a speaker string must pass the pipeline's speaker check
(`speakers.check(speaker, "speaker")`: it decodes and has the model's width), the same call the server makes before
it saves a voice or uses one; so the page cannot save a voice the server refuses on every use.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from chattts_velocity.text import decode_prompt
from chattts_velocity.text.voices import VoiceLibrary, check_voice_seed, voice_params

if TYPE_CHECKING:
    from chattts_velocity.speech import SpeechPipeline


class VoiceCheck:
    def __init__(self, pipeline: SpeechPipeline, voices: VoiceLibrary | None) -> None:
        self.pipeline, self.voices = pipeline, voices  # voices: what a saved voice's name typed as speaker finds

    def fits(self, speaker: str) -> None:
        """ValueError naming `speaker` unless the model can use it (the server's check)."""
        self.pipeline.speakers.check(speaker, "speaker")  # decodes (cached) and checks the model's width

    def voice(self, speaker: str, clip_code: str, transcript: str) -> tuple[str | None, ...]:
        """Generate's voice fields -> (spk_emb, spk_smp, txt_smp). A cloned clip wins over the speaker string."""
        speaker, clip_code, transcript = (s.strip() for s in (speaker or "", clip_code or "", transcript or ""))
        if clip_code:
            decode_prompt(clip_code)  # raises ValueError naming spk_smp when malformed
            if not transcript:
                raise ValueError("clip transcript: type the words spoken in the voice clip "
                                 "(or clear the clip to use the speaker string)")
            return None, clip_code, transcript
        if not speaker:
            return None, None, None
        try:  # a preset, seed or saved voice's name typed here is the server's voice of that name (voice_params)
            found = voice_params(speaker, self.voices, self._seed_speaker)
            if found["spk_smp"] is not None:  # a saved voice cloned from a clip
                return None, found["spk_smp"], found["txt_smp"]
            speaker = found["spk_emb"] or ""
            self.fits(speaker)
        except ValueError as exc:
            raise ValueError(f"{exc} (or press Random voice)") from None
        return speaker, None, None

    def _seed_speaker(self, seed: int) -> str:
        return self.pipeline.speakers.random(seed=check_voice_seed(seed))
