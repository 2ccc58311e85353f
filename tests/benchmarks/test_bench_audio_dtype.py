"""benchmarks/bench_audio_dtype.py on tiny weights: both decode precisions run, and the JSON holds every timing."""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks import bench_audio_dtype

REPO = Path(__file__).resolve().parents[2]


def test_the_report_times_both_precisions(tiny_assets, tmp_path: Path) -> None:
    report = bench_audio_dtype.main(["--model", str(tiny_assets), "--texts", "1,2", "--steps", "4", "--rounds", "2",
                                     "--threads", "1", "--name", "tiny", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "audio_dtype_tiny.json").read_text())
    assert saved == json.loads(json.dumps(report))
    for count in ("1", "2"):
        assert {dtype: len(times) for dtype, times in report["seconds"][count].items()} == {"bfloat16": 2, "float32": 2}
        assert report["bf16_over_float32"][count] > 0
