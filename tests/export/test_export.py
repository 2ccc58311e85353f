"""Batch export on tiny weights: naming, bad lines, resume without re-synthesis, seeds, atomic writes."""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import wave
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from chattts_velocity import Chat, InferCodeParams
from chattts_velocity import export as export_mod
from chattts_velocity.audio import Spoken, wav_bytes
from chattts_velocity.audio.timestamps import Timestamp
from chattts_velocity.export import export, plan_export, run_export
from chattts_velocity.export.local import store
from chattts_velocity.export.manifest import text_digest
from chattts_velocity.export.runner import run_shard, shards_of
from chattts_velocity.text import sample_random_speaker

STEPS = 8
CLIP = (2 * STEPS - 1) * 256  # samples of one sentence forced to STEPS steps
PARAMS = InferCodeParams(max_new_token=STEPS, min_new_token=STEPS, show_tqdm=False)
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet".split()



def say(i: int) -> str:
    return f"Say {WORDS[i % 10]} {WORDS[i // 10 % 10]}."


def run(chat, src: Path, out: Path, **kw) -> tuple[export_mod.ExportPlan, list[str]]:
    log: list[str] = []
    plan = export(chat, src, out, params=kw.pop("params", PARAMS), progress=False, log=log.append, **kw)
    return plan, log


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def frames(path: Path) -> int:
    with wave.open(str(path), "rb") as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
        return w.getnframes()


def pcm(data: bytes) -> np.ndarray:
    with wave.open(io.BytesIO(data), "rb") as w:
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.int32)


def same_audio(*clips: bytes) -> bool:
    """The same samples, bit for bit: a seeded line's audio does not depend on the batch around it."""
    first = pcm(clips[0])
    return all(np.array_equal(pcm(c), first) for c in clips[1:])


def manifest(out: Path) -> dict[int, dict]:
    """line -> its entry, with its speaker string looked up by the digest the entry records."""
    doc = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    return {e["line"]: e | {"speaker": doc["speakers"].get(e["speaker_sha256"])} for e in doc["lines"]}


def no_temp_files(out: Path) -> bool:
    return not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


def test_fifty_lines_two_bad_then_second_run_skips_the_finished(chat: Chat, tmp_path: Path) -> None:
    rows: list = [{"text": say(i)} for i in range(50)]
    rows[6] = '{"text": "unterminated'
    rows[30] = {"text": "A voice that is not one.", "speaker": "not a speaker string"}
    src, out = write_jsonl(tmp_path / "lines.jsonl", rows), tmp_path / "out"

    plan, log = run(chat, src, out)
    wavs = sorted(out.glob("*.wav"))
    assert len(wavs) == 48 and (plan.count("ok"), plan.count("error")) == (48, 2)
    assert {p.name for p in wavs} == {f"{k:05d}.wav" for k in range(1, 51)} - {"00007.wav", "00031.wav"}
    assert all(frames(p) == CLIP for p in wavs)
    assert log[-1] == "48/50 succeeded" and no_temp_files(out)
    first = manifest(out)
    assert sorted(first) == list(range(1, 51))
    assert first[7]["status"] == "error" and "invalid JSON" in first[7]["error"]
    assert first[31]["status"] == "error" and first[31]["error"].startswith("speaker:")
    assert first[1] | {"seed": None, "request": None, "audio": None} == {
        "line": 1, "text_sha256": text_digest(say(0)), "chars": len(say(0)), "id": None, "output": "00001.wav",
        "seed": None, "speaker_sha256": None, "speaker": None, "voice": None, "status": "ok",
        "error": None, "duration": CLIP / 24000, "request": None, "reason": None, "audio": None}
    assert first[1]["audio"] == hashlib.sha256((out / "00001.wav").read_bytes()).hexdigest()[:32]
    assert all(isinstance(first[k]["seed"], int) for k in first if k not in (7, 31))
    stamps = {p.name: p.stat().st_mtime_ns for p in wavs}

    # chat=None: the second run cannot synthesise anything, so it must skip every finished line
    plan2 = plan_export(src, out, params=PARAMS)
    log2: list[str] = []
    run_export(None, plan2, PARAMS, progress=False, log=log2.append)
    assert (plan2.count("skipped"), plan2.count("ok"), plan2.count("error")) == (48, 0, 2)
    assert "skipped 48 existing outputs in " + str(out) in log2 and log2[-1] == "48/50 succeeded"
    assert [m for m in log2 if m.startswith("line ")] == [m for m in log if m.startswith("line ")]
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.wav")} == stamps
    second = manifest(out)
    assert all(second[k]["status"] == "skipped" and second[k]["seed"] == first[k]["seed"]
               for k in first if k not in (7, 31))


def test_only_failed_lines_are_synthesised_again(chat: Chat, tmp_path: Path, monkeypatch) -> None:
    src, out = tmp_path / "lines.txt", tmp_path / "out"
    src.write_text("\n\n".join(say(i) for i in range(25)) + "\n", encoding="utf-8")  # blank lines between
    for blocked in ("00003.wav", "00041.wav"):  # a folder where the WAV should go: the write fails
        (out / blocked).mkdir(parents=True)
    plan, log = run(chat, src, out, seed=11)
    assert (plan.count("ok"), plan.count("error"), log[-1]) == (23, 2, "23/25 succeeded")
    assert {e["line"] for e in manifest(out).values() if e["status"] == "error"} == {3, 41}
    stamps = {p.name: p.stat().st_mtime_ns for p in out.glob("*.wav") if p.is_file()}

    for blocked in ("00003.wav", "00041.wav"):
        (out / blocked).rmdir()
    seen: list[str] = []
    real = chat.pipeline.synthesis

    def counting(job, *args):
        seen.extend(job.texts)
        return real(job, *args)

    monkeypatch.setattr(chat.pipeline, "synthesis", counting)
    plan, log = run(chat, src, out, seed=11)
    assert seen == [say(1), say(20)]  # file lines 3 and 41
    assert (plan.count("ok"), plan.count("skipped") - 24, log[-1]) == (2, 23, "25/25 succeeded")  # 24 empty lines
    assert all(out.joinpath(name).stat().st_mtime_ns == t for name, t in stamps.items())
    assert frames(out / "00003.wav") == CLIP and no_temp_files(out)


def test_jsonl_ids_speakers_seeds_outputs_and_bad_fields(chat: Chat, tmp_path: Path) -> None:
    torch.manual_seed(1)
    spk = chat.sample_random_speaker()
    rows = [
        {"id": "intro/part 1", "text": "Hello there."},  # 1
        {"id": 42, "text": "Numbers work as ids."},  # 2
        {"text": "Put me in a folder.", "output": "sub/dir/custom.wav", "seed": 5},  # 3
        {"text": "A chosen voice.", "speaker": spk, "seed": 9},  # 4
        {"text": "A chosen voice.", "seed": 9},  # 5
        {"text": "Out of the folder.", "output": "../escape.wav"},  # 6
        {"text": "Absolute.", "output": str(tmp_path / "abs.wav")},  # 7
        {"text": "Same name again.", "id": "intro/part 1"},  # 8
        {"text": "Bad seed.", "seed": "seven"},  # 9
        {"text": "  "},  # 10
        ["not", "an", "object"],  # 11
        {"text": "Unknown field.", "colour": "x"},  # 12
        {"text": "Wrong type.", "output": "a.mp3"},  # 13
        {"text": "Normalised path.", "output": "sub/../inside.wav"},  # 14
    ]
    out = tmp_path / "out"
    plan, _ = run(chat, write_jsonl(tmp_path / "in.jsonl", rows), out)
    m = manifest(out)
    ok = {k: e["output"] for k, e in m.items() if e["status"] == "ok"}
    assert ok == {1: "intro_part_1.wav", 2: "42.wav", 3: "sub/dir/custom.wav", 4: "00004.wav", 5: "00005.wav",
                  14: "inside.wav"}
    reasons = {k: e["error"] for k, e in m.items() if e["status"] == "error"}
    for k, word in {6: "escapes", 7: "absolute", 8: "already used by line 1", 9: "seed", 10: "text",
                    11: "JSON object", 12: "unknown field", 13: ".wav"}.items():
        assert word in reasons.pop(k)
    assert not reasons and not (tmp_path / "escape.wav").exists() and not (tmp_path / "abs.wav").exists()
    assert (m[3]["seed"], m[4]["seed"], m[4]["speaker"], m[1]["id"], m[2]["id"]) == (5, 9, spk, "intro/part 1", "42")
    # the speaker is honoured: line 4 equals a direct infer with that voice, and differs from line 5
    params = InferCodeParams(max_new_token=STEPS, min_new_token=STEPS, show_tqdm=False, manual_seed=9, spk_emb=spk)
    direct = chat.infer(["A chosen voice."], skip_refine_text=True, params_infer_code=params, use_vllm=True)[0]
    assert same_audio((out / "00004.wav").read_bytes(), wav_bytes(direct))
    assert not same_audio((out / "00004.wav").read_bytes(), (out / "00005.wav").read_bytes())


def test_same_line_and_seed_give_the_same_wav_alone_or_among_others(chat: Chat, tmp_path: Path) -> None:
    text = "Hello there, how are you today?"
    lines = [say(i) for i in range(12)]
    lines[4] = text
    src = tmp_path / "many.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    run(chat, src, tmp_path / "many", seed=100)
    assert manifest(tmp_path / "many")[5]["seed"] == 104  # line k uses seed + k - 1

    run(chat, write_jsonl(tmp_path / "one.jsonl", [{"text": text, "seed": 104}]), tmp_path / "one")
    many, one = (tmp_path / "many" / "00005.wav").read_bytes(), (tmp_path / "one" / "00001.wav").read_bytes()
    params = InferCodeParams(max_new_token=STEPS, min_new_token=STEPS, show_tqdm=False, manual_seed=104)
    direct = chat.infer([text], skip_refine_text=True, params_infer_code=params, use_vllm=True)[0]
    assert same_audio(many, one, wav_bytes(direct))

    # without --seed the random seed is recorded, and replaying it reproduces the line
    src.write_text("\n".join(lines[:3]) + "\n", encoding="utf-8")
    run(chat, src, tmp_path / "random")
    seed = manifest(tmp_path / "random")[2]["seed"]
    run(chat, write_jsonl(tmp_path / "again.jsonl", [{"text": lines[1], "seed": seed}]), tmp_path / "again")
    assert same_audio((tmp_path / "random" / "00002.wav").read_bytes(), (tmp_path / "again" / "00001.wav").read_bytes())


def test_resume_redoes_cut_short_and_changed_lines(chat: Chat, tmp_path: Path) -> None:
    src, out = tmp_path / "in.txt", tmp_path / "out"
    src.write_text("\n".join(say(i) for i in range(6)) + "\n", encoding="utf-8")
    run(chat, src, out, seed=0)
    cut = out / "00002.wav"
    cut.write_bytes(cut.read_bytes()[:1000])  # as if another tool died mid-write
    src.write_text("\n".join([say(i) for i in range(5)] + ["A new last line."]) + "\n", encoding="utf-8")
    plan, _ = run(chat, src, out, seed=0)
    assert {line.line for line in plan.lines if line.status == "ok"} == {2, 6}
    assert plan.count("skipped") == 4 and frames(cut) == CLIP
    assert manifest(out)[6]["text_sha256"] == text_digest("A new last line.")


def test_an_overwide_speaker_fails_its_line_only(chat: Chat, tmp_path: Path) -> None:
    torch.manual_seed(0)
    full_size = sample_random_speaker(768)  # this model's speakers are 64 wide
    rows = [{"text": say(0)}, {"text": say(1), "speaker": full_size}, {"text": say(2)}]
    plan, _ = run(chat, write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out")
    assert [line.status for line in plan.lines] == ["ok", "error", "ok"]
    assert "768" in plan.lines[1].error and "64" in plan.lines[1].error


def test_a_line_too_long_for_the_engine_fails_alone(tiny_assets: Path, tmp_path: Path) -> None:
    small = Chat()
    small.load(source="custom", custom_path=tiny_assets, verify=False, use_vllm=True, max_model_len=64)
    lines = [say(i) for i in range(6)]
    lines[3] = "word " * 100  # one sentence whose prompt alone exceeds max_model_len
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    plan, _ = run(small, src, tmp_path / "out")
    assert [line.status for line in plan.lines] == ["ok", "ok", "ok", "error", "ok", "ok"]
    assert "max_model_len" in plan.lines[3].error


class StubPipeline:
    """A speech pipeline whose jobs make a tone per text, fails on 'boom' and can raise after some lines."""

    config = SimpleNamespace(hidden_size=64)
    paths, dtype = SimpleNamespace(root=Path("stub-model")), "float32"

    def __init__(self, stop_after: int | None = None) -> None:
        self.stop_after, self.calls = stop_after, []

    def synthesis(self, job):
        """The job's verbs as SpeechPipeline.synthesis gives them (each(), for a job of shape "each")."""
        return SimpleNamespace(each=lambda: self.each(job))

    def each(self, job):
        texts, params, timestamps = job.texts, job.params, job.timestamps
        self.calls.append(list(texts))
        for i, text in enumerate(texts):
            if self.stop_after is not None and i == self.stop_after:
                raise KeyboardInterrupt
            if "boom" in text:
                raise RuntimeError("model exploded")
            # a tone whose length and pitch follow the text and seed
            t = np.arange(0 if "silent" in text else 2400 * len(text.split()), dtype=np.float32)
            wav = 0.1 * np.sin(t * (0.01 + params[i].manual_seed % 7 / 100)).astype(np.float32)
            yield i, Spoken(wav, [Timestamp(text, 0.0, len(wav) / 24000)]) if timestamps else wav


def test_a_failing_batch_is_retried_until_the_culprit_is_alone(tmp_path: Path) -> None:
    src, out = tmp_path / "in.txt", tmp_path / "out"
    src.write_text("one\ntwo\nboom\nfour\nsilent\nsix\n", encoding="utf-8")
    stub = StubPipeline()
    plan, log = run(stub, src, out)
    assert [line.status for line in plan.lines] == ["ok", "ok", "error", "ok", "error", "ok"]
    assert plan.lines[2].error == "synthesis failed: RuntimeError: model exploded"
    assert "no audio" in plan.lines[4].error and log[-1] == "4/6 succeeded"
    # the 4 unfinished lines retry in halves; only the half holding the culprit splits again
    assert stub.calls == [["one", "two", "boom", "four", "silent", "six"], ["boom", "four"], ["boom"], ["four"],
                          ["silent", "six"]]


def test_interrupted_run_leaves_only_complete_files(tmp_path: Path, monkeypatch) -> None:
    src, out = tmp_path / "in.txt", tmp_path / "out"
    src.write_text("".join(f"line {w}\n" for w in WORDS), encoding="utf-8")
    with pytest.raises(KeyboardInterrupt):
        run(StubPipeline(stop_after=4), src, out)
    assert sorted(p.name for p in out.glob("*.wav")) == [f"{k:05d}.wav" for k in range(1, 5)]
    assert [e["status"] for e in manifest(out).values()] == ["ok"] * 4 + ["pending"] * 6 and no_temp_files(out)

    real_write = Path.write_bytes

    def die_mid_write(path: Path, data: bytes) -> None:  # the disk fills while a WAV is written
        real_write(path, data[:100])
        raise OSError("disk full")

    monkeypatch.setattr(Path, "write_bytes", die_mid_write)
    plan, _ = run(StubPipeline(), src, out)
    assert plan.count("skipped") == 4 and all("disk full" in line.error for line in plan.lines[4:])
    assert len(list(out.glob("*.wav"))) == 4 and no_temp_files(out)
    monkeypatch.undo()
    plan, log = run(StubPipeline(), src, out)
    assert (plan.count("skipped"), plan.count("ok"), log[-1]) == (4, 6, "10/10 succeeded")


def test_bad_arguments_raise_value_errors(tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("Hello.\n", encoding="utf-8")
    with pytest.raises(FileNotFoundError):
        plan_export(tmp_path / "missing.txt", tmp_path / "out")
    with pytest.raises(ValueError, match="speaker"):
        plan_export(src, tmp_path / "out", speaker="nope")
    with pytest.raises(ValueError, match="seed"):
        plan_export(src, tmp_path / "out", seed=-1)
    (tmp_path / "blank.txt").write_text("\n  \n", encoding="utf-8")
    with pytest.raises(ValueError, match="no non-blank lines"):
        plan_export(tmp_path / "blank.txt", tmp_path / "out")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match="UTF-8"):
        plan_export(tmp_path / "latin1.txt", tmp_path / "out")
    with pytest.raises(ValueError, match="^speech: a loaded Chat"):
        run_export(None, plan_export(src, tmp_path / "out"), progress=False, log=lambda m: None)


def test_wav_seconds_accepts_only_complete_wavs(tmp_path: Path) -> None:
    good = tmp_path / "good.wav"
    good.write_bytes(wav_bytes(np.full(4800, 0.1, np.float32)))
    assert export_mod.wav_seconds(good) == pytest.approx(0.2)
    cut = tmp_path / "cut.wav"
    cut.write_bytes(good.read_bytes()[:-10])
    empty = tmp_path / "empty.wav"
    empty.write_bytes(wav_bytes(np.zeros(0, np.float32)))
    stereo = io.BytesIO()
    with wave.open(stereo, "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(24000)
        w.writeframes(b"\0" * 400)
    (tmp_path / "stereo.wav").write_bytes(stereo.getvalue())
    (tmp_path / "text.wav").write_text("not audio")
    for name in ("cut", "empty", "stereo", "text", "missing"):
        assert export_mod.wav_seconds(tmp_path / f"{name}.wav") is None, name


def test_a_killed_run_is_resumed_from_the_journal_and_changed_lines_are_made_again(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    src, out = tmp_path / "in.txt", tmp_path / "out"
    src.write_text("".join(f"line {w}\n" for w in WORDS), encoding="utf-8")
    monkeypatch.setattr(export_mod.ExportPlan, "save", lambda plan: None)  # killed before any manifest write
    with pytest.raises(KeyboardInterrupt):
        run(StubPipeline(stop_after=4), src, out)
    monkeypatch.undo()
    assert not (out / "manifest.json").exists() and len((out / "manifest.journal").read_text().splitlines()) == 4
    src.write_text("".join(f"line {w}\n" for w in ["CHANGED", *WORDS[1:]]), encoding="utf-8")
    plan, log = run(stub := StubPipeline(), src, out)
    assert [line.status for line in plan.lines] == ["ok", "skipped", "skipped", "skipped"] + ["ok"] * 6
    assert stub.calls == [["line CHANGED", *[f"line {w}" for w in WORDS[4:]]]]  # the old 00001.wav is not trusted
    assert log[-1] == "10/10 succeeded" and not (out / "manifest.journal").exists()


def test_a_wav_the_record_does_not_know_is_made_again(tmp_path: Path) -> None:
    src, out = tmp_path / "in.txt", tmp_path / "out"
    src.write_text("one\ntwo\n", encoding="utf-8")
    out.mkdir()
    (out / "00001.wav").write_bytes(wav_bytes(np.full(2400, 0.1, np.float32)))  # complete, but from who knows what
    plan, _ = run(StubPipeline(), src, out)
    assert [line.status for line in plan.lines] == ["ok", "ok"]
    plan, _ = run(StubPipeline(), src, out, params=dataclasses.replace(PARAMS, temperature=0.5))
    assert [line.status for line in plan.lines] == ["ok", "ok"]  # other sampling parameters: a new request


def test_the_manifest_records_every_line_and_the_run(tmp_path: Path) -> None:
    src, out = tmp_path / "in.txt", tmp_path / "out"
    src.write_text("one\n\n   \ntwo\n", encoding="utf-8")
    plan, log = run(StubPipeline(), src, out)
    doc = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert [(e["line"], e["status"], e["reason"]) for e in doc["lines"]] == [
        (1, "ok", None), (2, "skipped", "empty line"), (3, "skipped", "empty line"), (4, "ok", None)]
    assert (doc["total"], doc["succeeded"], log[-1]) == (2, 2, "2/2 succeeded")
    assert doc["model"] == "stub-model" and doc["precision"] == "float32"
    assert doc["params"]["max_new_token"] == STEPS and doc["started"] <= doc["updated"]


def test_ray_export_shards_give_every_actor_work() -> None:
    from chattts_velocity.export.ray import RayExportOptions

    assert RayExportOptions(actors=2, batch_size=16).shard_size(30) == 15  # both actors get a shard
    assert RayExportOptions(actors=2, batch_size=16).shard_size(200) == 16  # big jobs: batch_size lines a shard
    assert RayExportOptions(actors=4, batch_size=16).shard_size(3) == 1
    for lines in range(1, 80):
        size = RayExportOptions(actors=3, batch_size=8).shard_size(lines)
        assert 1 <= size <= 8 and math.ceil(lines / size) >= min(lines, 3)  # every actor can be handed a shard
    for bad in ({"actors": 0}, {"batch_size": 1.5}, {"batches_in_flight": True}, {"cpus_per_actor": -1}):
        with pytest.raises(ValueError, match=next(iter(bad)).split("_per")[0]):
            RayExportOptions(**bad)


def test_shards_run_elsewhere_and_stored_here_give_the_local_export_s_files(tmp_path: Path) -> None:
    """What the Ray export does, without Ray: the runner per shard on a "worker", store() on the "driver"."""
    src = tmp_path / "in.txt"
    src.write_text("".join(f"line {w} and more words\n" for w in WORDS[:5]) + "boom\n", encoding="utf-8")
    settings = {"seed": 1, "params": PARAMS, "loudness": -20.0, "timestamps": True}
    local = run_export(StubPipeline(), plan_export(src, tmp_path / "local", **settings), PARAMS, progress=False,
                       log=lambda m: None)

    plan = plan_export(src, tmp_path / "sharded", **settings)
    shards = shards_of(plan, PARAMS, 4)
    assert [[line.key for line in shard.lines] for shard in shards] == [[0, 1, 2, 3], [4, 5]]
    assert [line.params.manual_seed for line in shards[1].lines] == [5, 6] and shards[0].timestamps
    for shard in reversed(shards):  # shards finish in any order
        results: list = []
        run_shard(StubPipeline(), shard, results.append, lambda m: None)
        for result in results:
            store(plan, result, lambda m: None)
    plan.save()
    plan.release()
    assert [line.status for line in plan.lines] == [line.status for line in local.lines] == ["ok"] * 5 + ["error"]
    assert [line.audio for line in plan.lines] == [line.audio for line in local.lines]
    files = sorted(p.name for p in (tmp_path / "local").iterdir() if p.suffix in (".wav", ".json"))
    assert len(files) == 11 and files == sorted(p.name for p in (tmp_path / "sharded").iterdir()
                                                if p.suffix in (".wav", ".json"))
    for name in files:
        if name != "manifest.json":
            assert (tmp_path / "local" / name).read_bytes() == (tmp_path / "sharded" / name).read_bytes(), name
    loud = pcm((tmp_path / "local" / "00001.wav").read_bytes())
    assert np.abs(loud).max() > 0.1 * 32768  # normalised to -20 LUFS, not the stub's quiet 0.1
