"""Batch export: a text or JSON Lines file -> one WAV per line, plus manifest.json; resumable.

plan.py checks the input and finds finished outputs (no model needed); run.py synthesises the rest on this
machine through Chat.infer_many; ray.py does the same on a Ray Data actor pool (needs the [ray] extra, imported
only from there).
"""
from chattts_velocity.export.manifest import MANIFEST, replace_atomically, wav_seconds
from chattts_velocity.export.plan import FIELDS, ExportLine, ExportPlan, plan_export, read_input
from chattts_velocity.export.run import CHUNK_SIZE, Log, export, run_export

__all__ = [
    "CHUNK_SIZE", "FIELDS", "MANIFEST", "ExportLine", "ExportPlan", "Log", "export",
    "plan_export", "read_input", "replace_atomically", "run_export", "wav_seconds",
]
