"""Batch export: a text or JSON Lines file -> one WAV per line, plus manifest.json; resumable.

plan.py checks the input and finds finished outputs (no model needed); runner.py is the one runner that turns a
shard of pending lines into finished files; local.py runs it on this machine and stores what it makes; ray.py runs
it per shard on a Ray actor pool (needs the [ray] extra, imported only from there).
"""
from chattts_velocity.export.line import ExportLine
from chattts_velocity.export.local import CHUNK_SIZE, export, run_export
from chattts_velocity.export.manifest import MANIFEST, replace_atomically, wav_seconds
from chattts_velocity.export.plan import FIELDS, ExportPlan, plan_export, read_input
from chattts_velocity.export.runner import Log

__all__ = [
    "CHUNK_SIZE", "FIELDS", "MANIFEST", "ExportLine", "ExportPlan", "Log", "export",
    "plan_export", "read_input", "replace_atomically", "run_export", "wav_seconds",
]
