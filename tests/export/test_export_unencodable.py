"""Batch export against lines UTF-8 cannot write or names no file system holds: each such line is refused by name
before any synthesis, the manifest is written, and a batch's failure never makes a finished line again."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from chattts_velocity import Chat, InferCodeParams
from chattts_velocity.export import plan_export, run_export
from chattts_velocity.export.manifest import text_digest
from chattts_velocity.export.runner import Shard, ShardLine, run_shard

STEPS = 6
PARAMS = InferCodeParams(max_new_token=STEPS, min_new_token=STEPS, show_tqdm=False)
LINES = [
    {"text": "First line here.", "id": "first"},
    {"text": "Broken \ud800 here.", "id": "surrogate-text"},
    {"text": "An id that is not text.", "id": "bad-\udfff-id"},
    {"text": "Too long a name.", "id": "语" * 100},
    {"text": "Too long an output.", "output": "y" * 240 + ".wav"},
    {"text": "Last line here.", "id": "last"},
]


def test_unencodable_and_overlong_lines_fail_alone_and_the_manifest_is_written(chat: Chat, tmp_path: Path) -> None:
    src, out = tmp_path / "lines.jsonl", tmp_path / "out"
    src.write_text("\n".join(json.dumps(line) for line in LINES) + "\n", encoding="utf-8")  # ASCII: \ud800 escapes
    plan = plan_export(src, out, seed=1, params=PARAMS)
    assert [line.line for line in plan.todo] == [1, 6]  # refused before the model is asked for anything
    run_export(chat, plan, PARAMS, progress=False, log=lambda _: None)
    record = json.loads((out / "manifest.json").read_text(encoding="utf-8"))["lines"]
    assert [entry["status"] for entry in record] == ["ok", "error", "error", "error", "error", "ok"]
    assert record[1]["error"].startswith("text: holds '\\ud800' at character 7") and "surrogate" in record[1]["error"]
    assert record[1]["text_sha256"] == text_digest("Broken \\ud800 here.")  # the digest of its escaped text
    assert record[2]["error"].startswith("id: holds '\\udfff'")
    assert record[3]["error"].startswith("id: makes the file name") and "255 bytes" in record[3]["error"]
    assert record[4]["error"].startswith("output: makes the file name")
    again = plan_export(src, out, seed=1, params=PARAMS)  # a re-run finishes (nothing left to make)
    assert not again.todo and run_export(None, again, PARAMS, progress=False, log=lambda _: None)
    assert (out / "manifest.json").exists()


class FailsAfterFirst:
    """A pipeline whose batch yields its first line, then fails; alone, every line succeeds."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def synthesis(self, job):
        """The job's verbs as SpeechPipeline.synthesis gives them (each(), for a job of shape "each")."""
        return SimpleNamespace(each=lambda: self.each(job))

    def each(self, job):
        self.calls.append(list(job.texts))
        yield 0, np.full(2400, 0.1, np.float32)
        if len(job.texts) > 1:
            raise RuntimeError("the batch failed")


def test_a_failed_batch_retries_only_the_lines_not_finished() -> None:
    pipeline, results = FailsAfterFirst(), {}
    lines = [ShardLine(k, f"line {k}", PARAMS) for k in range(4)]
    run_shard(pipeline, Shard(lines), lambda r: results.setdefault(r.key, []).append(r), lambda _: None)
    assert sorted(results) == [0, 1, 2, 3] and all(len(r) == 1 and r[0].error is None for r in results.values())
    assert all("line 0" not in call for call in pipeline.calls[1:])  # the finished line is never made again
