"""Ray Serve replicas and the Ray Data export on a private loopback-only local cluster (tiny random weights)."""
from __future__ import annotations

import asyncio
import io
import json
import os
import re
import shutil
import socket
import tempfile
import time
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
from chattts_velocity.serve import ray_serve  # noqa: E402 -- imports no ray

for _key, _value in ray_serve.LOOPBACK_ENV.items():  # before the first `import ray` of this process
    os.environ.setdefault(_key, _value)
ray = pytest.importorskip("ray")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pyloudnorm = pytest.importorskip("pyloudnorm")

from chattts_velocity.audio.loudness import PEAK_LIMIT  # noqa: E402 (after the importorskip above)
from chattts_velocity.cluster import load_worker_chat  # noqa: E402 (after the importorskip above)
from chattts_velocity.export import plan_export, run_export, wav_seconds  # noqa: E402 (after the importorskip above)
from chattts_velocity.export.ray import RayExportOptions, ShardWorker, run_export_ray  # noqa: E402 (after the importorskip above)
from chattts_velocity.export.runner import LineResult, Shard, ShardLine, shards_of  # noqa: E402 (after the importorskip above)
from chattts_velocity.params import InferCodeParams  # noqa: E402 (after the importorskip above)
from chattts_velocity.serve import ServerConfig  # noqa: E402 (after the importorskip above)
from chattts_velocity.serve.metrics import ENGINE_METRICS, SPEECH_METRICS  # noqa: E402 (after the importorskip above)
from chattts_velocity.speech import StreamOptions  # noqa: E402 (after the importorskip above)
from chattts_velocity.text import VoiceLibrary, encode_prompt, sample_random_speaker  # noqa: E402 (after the importorskip above)

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
REPO = Path(__file__).resolve().parents[2]
HOP = 256
KV_BYTES = 32 * 2**20  # per engine: plenty for the tiny model, and 4 engines share this box
# min_new_tokens == max_new_tokens forbids an early EOS, so the work is certain on any host: 1500 forced steps
# of four pieces take over 10 s on the fastest host seen (tiny weights, Zen 5), against client timeouts of 1 s.
FORCED = {"max_new_tokens": 1500, "min_new_tokens": 1500}
FORCED_INPUT = " ".join(["Nobody listens to the end of this sentence."] * 4)
LOAD = {"verify": False, "kv_cache_memory": KV_BYTES}  # random demo weights carry no official checksums


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition, timeout: float = 180.0, what: str = "condition") -> None:  # a hung test's deadline only
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not reached in {timeout:.0f} s"
        time.sleep(0.1)


def piece_samples(steps: int) -> int:
    """A one-sentence clip of T steps decodes to (2T - 1) * 256 samples (tiny random weights rarely stop early)."""
    return (2 * steps - 1) * HOP


def assert_clip(samples: int, steps: int) -> None:
    assert samples % (2 * HOP) == HOP and 0 < samples <= piece_samples(steps)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[dict]:
    """One private cluster per session: 2 logical CPUs, 256 MiB object store, no dashboard, loopback only."""
    temp = tempfile.mkdtemp(prefix="cv-ray-")  # short: Ray's socket paths must stay under 108 bytes
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    info = ray_serve.init_ray(num_cpus=2, object_store_mb=256, temp_dir=temp)
    try:
        yield info
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


# ---- the cluster -----------------------------------------------------------------------------------
def test_cluster_is_loopback_only(ray_cluster: dict) -> None:
    assert ray_cluster["node_ip_address"] == "127.0.0.1"
    assert ray_cluster["gcs_address"].rsplit(":", 1)[0] == "127.0.0.1"
    assert {node["NodeManagerAddress"] for node in ray.nodes()} == {"127.0.0.1"}


# ---- Ray Serve: 2 replicas of the OpenAI speech app --------------------------------------------------
class TestServe:
    @pytest.fixture(scope="class")
    def url(self, ray_cluster: dict, tiny_assets: Path) -> Iterator[str]:
        from ray import serve

        # Serve gives its HTTP proxy actor 60 s to start; a loaded 2-core host has missed that (the proxy process was
        # still importing). The test is about our app, not the proxy's start-up speed: give it 5 minutes.
        from ray.serve._private import api as serve_api

        if hasattr(serve_api, "HTTP_PROXY_TIMEOUT"):
            serve_api.HTTP_PROXY_TIMEOUT = max(serve_api.HTTP_PROXY_TIMEOUT, 300)
        options = ray_serve.ReplicaOptions(replicas=2, num_cpus=0.25)  # 2 x 0.25 leaves CPUs for Ray Data
        app = ray_serve.build_app(tiny_assets, ServerConfig(max_new_token=2000, cache_mb=0), options, **LOAD)
        started = time.perf_counter()
        url = ray_serve.serve_on_ray(app, port=free_port(), blocking=False)
        print(f"serve: 2 replicas ready in {time.perf_counter() - started:.1f} s")
        try:
            yield url
        finally:
            serve.shutdown()

    def test_twenty_concurrent_openai_requests_reach_both_replicas(self, url: str) -> None:
        async def main() -> list:
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
            calls = [client.audio.speech.with_raw_response.create(
                model="tts-1", voice="alloy", input=f"Ray request number {i % 10}.", response_format="wav",
                extra_body={"seed": i % 10, "max_new_tokens": 8}) for i in range(20)]
            return await asyncio.gather(*calls)

        started = time.perf_counter()
        responses = asyncio.run(main())
        print(f"serve: 20 concurrent requests in {time.perf_counter() - started:.2f} s")
        audio = [parse_wav(r.content) for r in responses]
        replicas = [r.headers[ray_serve.REPLICA_HEADER] for r in responses]
        print("serve: requests per replica", {name: replicas.count(name) for name in set(replicas)})
        assert all(r.status_code == 200 for r in responses)
        assert len(set(replicas)) == 2
        for clip in audio:
            assert_clip(len(clip), 8)
            assert np.abs(clip).max() > 0
        for i in range(10):
            # Request i and i + 10 are the same request: the same bytes on any replica, in any batch.
            assert responses[i].content == responses[i + 10].content
        assert not np.array_equal(audio[0], audio[1])

    def test_stream_arrives_in_chunks(self, url: str) -> None:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
        arrivals, data = [], b""
        started = time.perf_counter()
        with client.audio.speech.with_streaming_response.create(
                model="tts-1", voice="echo", input="A streamed sentence through the Serve proxy.",
                response_format="pcm", extra_body={"stream": True, "seed": 1, "max_new_tokens": 200,
                                                   "min_new_tokens": 200}) as response:
            for chunk in response.iter_bytes():
                arrivals.append(time.perf_counter() - started)
                data += chunk
        print(f"serve: {len(data) // 2} samples in {len(arrivals)} chunks, first at {arrivals[0]:.2f} s, "
              f"last at {arrivals[-1]:.2f} s")
        assert len(data) // 2 == piece_samples(200)  # forced: exactly 200 steps, several 24-step chunks
        # The first audio comes after ~1/3 of the steps (first chunk + lookahead) and the rest in pieces: a ratio
        # of the request's own duration, so it holds on a slow or a fast host alike.
        assert len(arrivals) >= 3 and arrivals[0] < 0.6 * arrivals[-1]

    def test_client_disconnect_aborts_the_engine_request(self, url: str) -> None:
        body = {"input": FORCED_INPUT, "voice": "echo", "response_format": "pcm", "stream": True, "seed": 9,
                **FORCED}
        with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=120) as response:
            replica = response.headers[ray_serve.REPLICA_HEADER]
            next(response.iter_bytes())  # audio is flowing; leaving the block drops the connection
        wait_until(lambda: replica_metrics(url, replica, ENGINE_METRICS["num_aborted"].sample) >= 1,
                   what="the engine requests aborted")
        wait_until(lambda: replica_metrics(url, replica, ENGINE_METRICS["kv_blocks_used"].sample) == 0,
                   what="KV blocks freed")

    def test_non_streamed_client_timeout_aborts_too(self, url: str) -> None:
        body = {"input": FORCED_INPUT, "voice": "sage", "response_format": "wav", "seed": 6, "stream": False,
                **FORCED}
        names = replica_names(url)
        before = {name: replica_metrics(url, name, ENGINE_METRICS["num_aborted"].sample) for name in names}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/audio/speech", json=body, timeout=1.0)
        wait_until(lambda: sum(replica_metrics(url, name, ENGINE_METRICS["num_aborted"].sample)
                               for name in names) > sum(before.values()), what="the engine requests aborted")

    def test_metrics_show_every_replica_labelled(self, url: str) -> None:
        names = replica_names(url)
        assert len(names) == 2

        def labelled() -> set[str]:
            text = httpx.get(url + "/metrics", timeout=30).text
            requests = SPEECH_METRICS["requests"].sample
            return set(re.findall(rf'^{requests}\{{replica="([^"]+)"\}} \d', text, re.MULTILINE))

        wait_until(lambda: labelled() == names, what="both replicas on one /metrics page")
        text = httpx.get(url + "/metrics", timeout=30).text
        assert text.count(f"# TYPE {SPEECH_METRICS['requests'].sample} counter") == 1  # one family, two samples

    def test_health_and_models_through_the_proxy(self, url: str) -> None:
        assert httpx.get(url + "/health", timeout=30).json() == {"status": "ok"}
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        assert {m.id for m in client.models.list()} >= {"chattts", "tts-1"}
        bad = httpx.post(url + "/v1/audio/speech", json={"input": "", "voice": "alloy"}, timeout=30)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"


def parse_wav(data: bytes) -> np.ndarray:
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")


def replica_names(url: str, tries: int = 40) -> set[str]:
    return {httpx.get(url + "/health", timeout=30).headers[ray_serve.REPLICA_HEADER] for _ in range(tries)}


def replica_metrics(url: str, replica: str, name: str, tries: int = 40) -> float:
    """`name` of one replica from /metrics (every replica's samples, labelled replica="..."; the answering replica's
    own are always fresh, so ask until that one answers)."""
    for _ in range(tries):
        response = httpx.get(url + "/metrics", timeout=30)
        if response.headers[ray_serve.REPLICA_HEADER] == replica:
            prefix = f'{name}{{replica="{replica}"}} '
            return next(float(line.split()[-1]) for line in response.text.splitlines() if line.startswith(prefix))
    raise AssertionError(f"replica {replica} did not answer /metrics in {tries} tries")


# ---- the Serve config example ------------------------------------------------------------------------
def test_serve_config_example_is_valid_and_loopback(ray_cluster: dict, tiny_assets: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    yaml = pytest.importorskip("yaml")
    from ray.serve.schema import ServeDeploySchema

    config = ServeDeploySchema.model_validate(yaml.safe_load((REPO / "examples" / "ray_serve_config.yaml").read_text()))
    assert config.http_options.host == "127.0.0.1"
    (app,) = config.applications
    assert app.import_path == "chattts_velocity.serve.ray_serve:app_builder"
    (deployment,) = app.deployments
    assert deployment.name == ray_serve.DEPLOYMENT and deployment.max_ongoing_requests >= 64
    built = ray_serve.app_builder({**app.args, "model": str(tiny_assets), "verify": False})
    assert type(built).__name__ == "Application"
    with pytest.raises(ValueError, match="unknown field"):
        ray_serve.app_builder({"model": str(tiny_assets), "max_new_tokens": 5})
    with pytest.raises(ValueError, match="stream"):
        ray_serve.app_builder({"model": str(tiny_assets), "stream": {"first_chunk": 8}})
    captured = []
    monkeypatch.setattr(ray_serve, "build_app", lambda model, config, **kw: captured.append((config, kw)))
    ray_serve.app_builder({**app.args, "model": str(tiny_assets), "verify": False})
    (config, load_kwargs), = captured
    assert config.stream_options == StreamOptions(**app.args["stream"]) and config.stream_options.first_chunk_steps
    assert load_kwargs["dtype"] == app.args["dtype"] and load_kwargs["kv_cache_memory"] > 0


# ---- the export on Ray actors ----------------------------------------------------------------------------
BAD = (17, 123)  # 1-based lines whose speaker string has the wrong width for the tiny model
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")


def write_lines(path: Path, bad_speaker: str | None) -> None:
    rows = []
    for n in range(1, 201):
        row = {"id": f"utt-{n:03d}", "text": f"Sentence {WORDS[n % 10]} {WORDS[n // 10 % 10]} of the Ray export."}
        if n in BAD and bad_speaker is not None:
            row["speaker"] = bad_speaker
        rows.append(json.dumps(row))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def test_data_export_200_lines_two_bad_then_resume(ray_cluster: dict, tiny_assets: Path, tmp_path: Path) -> None:
    lines, out, logs = tmp_path / "lines.jsonl", tmp_path / "out", []
    write_lines(lines, bad_speaker=sample_random_speaker(768))  # a full-size voice; the tiny model has 64
    params = InferCodeParams(max_new_token=8, show_tqdm=False)
    options = RayExportOptions(actors=2, cpus_per_actor=0.5, batch_size=16)

    started = time.perf_counter()
    plan = run_export_ray(tiny_assets, plan_export(lines, out, seed=5), params, options, progress=False,
                          log=logs.append, **LOAD)
    print(f"data: 200 lines on 2 actors in {time.perf_counter() - started:.1f} s")
    wavs = sorted(out.glob("*.wav"))
    assert len(wavs) == 198 and plan.count("ok") == 198 and plan.count("error") == 2
    for path in wavs:
        assert_clip(round(wav_seconds(path) * 24000), 8)
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    failed = [e for e in manifest["lines"] if e["status"] == "error"]
    assert (manifest["total"], manifest["succeeded"], manifest["failed"]) == (200, 198, 2)
    assert [e["line"] for e in failed] == list(BAD) and all("spk_emb" in e["error"] for e in failed)
    assert [e["seed"] for e in manifest["lines"]] == [5 + k for k in range(200)]
    assert f"line {BAD[0]}: synthesis failed" in "\n".join(logs)
    summary = next(line for line in logs if line.startswith("ray: "))
    print(summary)
    actors, first, second = re.fullmatch(r"ray: (\d+) actor\(s\) ran \[(\d+), (\d+)\] lines in 13 shard\(s\)",
                                         summary).groups()
    assert int(actors) == 2 and int(first) + int(second) == 200 and int(first) >= 16  # both actors ran shards
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    stamps = {p.name: p.stat().st_mtime_ns for p in wavs}

    write_lines(lines, bad_speaker=None)  # fix the two lines and run again: only they are synthesised
    again = plan_export(lines, out, seed=5)
    assert [line.line for line in again.todo] == list(BAD) and again.count("skipped") == 198
    run_export_ray(tiny_assets, again, params, options, progress=False, log=logs.append, **LOAD)
    assert again.count("ok") == 2 and again.succeeded == 200
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.wav") if p.name in stamps} == stamps
    assert len(list(out.glob("*.wav"))) == 200
    assert json.loads((out / "manifest.json").read_text(encoding="utf-8"))["succeeded"] == 200


def test_data_export_of_thirty_lines_runs_on_both_actors(ray_cluster: dict, tiny_assets: Path, tmp_path: Path) -> None:
    # 30 lines at 16 a shard would be 2 shards of 16 and 14; 15 and 15 keep both actors equally busy.
    lines, logs = tmp_path / "lines.jsonl", []
    lines.write_text("".join(json.dumps({"id": f"l{n}", "text": f"Line {WORDS[n % 10]} {n}."}) + "\n"
                             for n in range(30)))
    options = RayExportOptions(actors=2, cpus_per_actor=0.5, batch_size=16)
    plan = run_export_ray(tiny_assets, plan_export(lines, tmp_path / "out", seed=3),
                          InferCodeParams(max_new_token=8, show_tqdm=False), options, progress=False,
                          log=logs.append, **LOAD)
    assert plan.count("ok") == 30
    summary = next(line for line in logs if line.startswith("ray: "))
    print(summary)
    assert summary == "ray: 2 actor(s) ran [15, 15] lines in 2 shard(s)"


def test_export_on_ray_writes_the_local_export_s_files_with_timestamps_and_loudness(
        ray_cluster: dict, tiny_assets: Path, tmp_path: Path) -> None:
    """The same plan, seed, shards, timestamps and loudness: the same WAV digests and sidecars as on this machine.

    Batches of 12 instead of 6 give the same codes and timestamps; their WAVs may still differ by one 16-bit step in
    a few samples (docs/fidelity.md, "Not covered").
    """
    lines = tmp_path / "lines.txt"
    lines.write_text("".join(f"Line {WORDS[n % 10]} {WORDS[n // 3 % 10]} of the comparison.\n" for n in range(12)))
    params = InferCodeParams(max_new_token=24, min_new_token=24, show_tqdm=False)  # 0.5 s: loudness can measure it
    settings = {"seed": 7, "params": params, "loudness": -20.0, "timestamps": True}
    chat = load_worker_chat(str(tiny_assets), **LOAD)
    local = {size: run_export(chat, plan_export(lines, tmp_path / f"local{size}", **settings), params, size,
                              progress=False, log=lambda m: None) for size in (6, 12)}
    logs: list[str] = []
    remote = run_export_ray(tiny_assets, plan_export(lines, tmp_path / "ray", **settings), params,
                            RayExportOptions(actors=2, cpus_per_actor=0.5, batch_size=6), progress=False,
                            log=logs.append, **LOAD)
    assert "ray: 2 actor(s) ran [6, 6] lines in 2 shard(s)" in logs
    assert remote.count("ok") == local[6].count("ok") == 12
    names = sorted(p.name for p in (tmp_path / "ray").iterdir() if p.suffix in (".wav", ".json"))
    assert len(names) == 25
    for name in names:
        ray_file, local_file = tmp_path / "ray" / name, tmp_path / "local6" / name
        if name != "manifest.json":
            assert ray_file.read_bytes() == local_file.read_bytes(), name
        if name.endswith(".timestamps.json"):
            assert ray_file.read_bytes() == (tmp_path / "local12" / name).read_bytes(), name
        elif name.endswith(".wav"):  # other batches of the tiny model: see docs/fidelity.md, "Not covered"
            ray_pcm, other = parse_wav(ray_file.read_bytes()), parse_wav((tmp_path / "local12" / name).read_bytes())
            assert len(ray_pcm) == len(other) and np.abs(ray_pcm.astype(np.int32) - other).max() <= 1, name
    manifest = {name: json.loads((tmp_path / name / "manifest.json").read_text(encoding="utf-8"))
                for name in ("local6", "ray")}
    assert manifest["local6"]["lines"] == manifest["ray"]["lines"]
    assert [line.audio for line in remote.lines] == [line.audio for line in local[6].lines]
    spans = json.loads((tmp_path / "ray" / "00001.timestamps.json").read_text(encoding="utf-8"))
    seconds = wav_seconds(tmp_path / "ray" / "00001.wav")
    assert spans[0]["start"] == 0 and spans[-1]["end"] == pytest.approx(seconds, abs=1e-4)
    loud = parse_wav((tmp_path / "ray" / "00001.wav").read_bytes()).astype(np.float64) / 32768
    measured = pyloudnorm.Meter(24000).integrated_loudness(loud)
    assert abs(measured + 20.0) <= 0.5 or np.abs(loud).max() >= PEAK_LIMIT - 1e-3  # normalised (or peak-limited)


def test_export_on_ray_speaks_saved_voices_and_cloned_clips_as_the_local_export_does(
        ray_cluster: dict, tiny_assets: Path, tmp_path: Path) -> None:
    library = VoiceLibrary(tmp_path / "voices")
    library.save("Anna", speaker=sample_random_speaker(64))  # the tiny model's width
    library.save("Clip", clip_code=encode_prompt(torch.randint(0, 100, (4, 12))), transcript="some words")
    lines = tmp_path / "lines.jsonl"
    lines.write_text("".join(json.dumps({"text": f"Voice line {WORDS[n]}.", "voice": ("Anna", "Clip")[n % 2]}) + "\n"
                             for n in range(4)))
    params = InferCodeParams(max_new_token=8, min_new_token=8, show_tqdm=False)
    chat = load_worker_chat(str(tiny_assets), **LOAD)
    local = run_export(chat, plan_export(lines, tmp_path / "local", seed=2, params=params, voices=library), params,
                       2, progress=False, log=lambda m: None)
    remote = run_export_ray(tiny_assets, plan_export(lines, tmp_path / "ray", seed=2, params=params, voices=library),
                            params, RayExportOptions(actors=2, cpus_per_actor=0.5, batch_size=2), progress=False,
                            log=lambda m: None, **LOAD)
    assert remote.count("ok") == local.count("ok") == 4 and remote.clip_params(remote.lines[1])
    for line in remote.lines:
        assert (tmp_path / "ray" / line.output).read_bytes() == (tmp_path / "local" / line.output).read_bytes()
    assert [line.request for line in remote.lines] == [line.request for line in local.lines]  # voices in the hash


def test_export_cli_with_ray_timestamps_and_loudness_then_resume(ray_cluster: dict, tiny_assets: Path,
                                                                  tmp_path: Path, capsys) -> None:
    """`chattts-velocity export --ray --timestamps --loudness` on the session's cluster, run twice."""
    from chattts_velocity import cli

    lines = tmp_path / "lines.txt"
    lines.write_text("".join(f"Spoken line {WORDS[n]}.\n" for n in range(6)))
    args = ["export", str(lines), "-o", str(tmp_path / "out"), "--model", str(tiny_assets), "--no-verify",
            "--dtype", "float32", "--seed", "3", "--max-new-token", "24", "--timestamps", "--loudness", "-20",
            "--ray", "--actors", "2", "--batch-size", "2"]
    cli.main(args)
    first = capsys.readouterr().out
    assert "ray: 2 actor(s) ran [2, 4] lines in 3 shard(s)" in first  # 2 shards queued on one actor, 1 on the other
    assert first.rstrip().endswith("6/6 succeeded")
    wavs = sorted((tmp_path / "out").glob("*.wav"))
    assert len(wavs) == 6 and all(p.with_suffix(".timestamps.json").is_file() for p in wavs)
    doc = json.loads((tmp_path / "out" / "manifest.json").read_text(encoding="utf-8"))
    assert doc["params"]["loudness"] == -20.0 and [e["seed"] for e in doc["lines"]] == [3, 4, 5, 6, 7, 8]

    cli.main(args)  # everything is on record with its sidecar: nothing to synthesise
    assert "wrote 0, skipped 6 existing, 0 failed" in capsys.readouterr().out


def test_export_on_ray_from_a_folder_that_is_no_model_is_one_clear_error(ray_cluster: dict, tmp_path: Path) -> None:
    lines = tmp_path / "lines.txt"
    lines.write_text("Hello.\n")
    (tmp_path / "empty").mkdir()
    plan = plan_export(lines, tmp_path / "out", seed=1)
    with pytest.raises(ValueError, match="model_dir: an actor could not load"):
        run_export_ray(tmp_path / "empty", plan, InferCodeParams(max_new_token=8, show_tqdm=False),
                       RayExportOptions(actors=1), progress=False, log=lambda m: None, **LOAD)
    assert plan.lines[0].status == "error" and "no result" in plan.lines[0].error  # on record, to run again


def test_export_dispatch_reports_a_lost_actor_s_shard_and_hands_it_no_more(ray_cluster: dict) -> None:
    from chattts_velocity.export.ray import dispatch

    @ray.remote(num_cpus=0.25)
    class Worker:  # an actor process that dies on the line "die"
        def run(self, shard: Shard) -> list[LineResult]:
            if any(line.text == "die" for line in shard.lines):
                os._exit(1)
            return [LineResult(line.key, seconds=1.0) for line in shard.lines]

    shards = [Shard([ShardLine(key, text, InferCodeParams())]) for key, text in enumerate(["a", "die", "b", "c"])]
    got = {result.key: (name, result.error) for name, results in dispatch({"one": Worker.remote(),
                                                                           "two": Worker.remote()}, shards, 1)
           for result in results}
    assert got[0] == ("one", None) and got[2] == ("one", None) and got[3] == ("one", None)
    assert got[1][0] == "two" and "the Ray task failed (ActorDiedError" in got[1][1]


def test_export_shard_worker_reports_lines_and_survives_a_failing_step(tiny_assets: Path, tmp_path: Path) -> None:
    """The actor's class alone (no cluster): a bad line fails alone; a failing engine step fails its lines only."""
    lines = tmp_path / "lines.jsonl"
    rows = [{"text": "One."}, {"text": "Two."}, {"text": "Three.", "speaker": sample_random_speaker(768)}]
    lines.write_text("".join(json.dumps(row) + "\n" for row in rows))
    params = InferCodeParams(max_new_token=8, show_tqdm=False)
    plan = plan_export(lines, tmp_path / "out", seed=1)
    (shard,) = shards_of(plan, params, 3)
    plan.release()
    worker = ShardWorker(str(tiny_assets), LOAD)

    def run() -> dict[int, LineResult]:
        return {result.key: result for result in worker.run(shard)}

    first = run()
    assert [first[k].error is None for k in range(3)] == [True, True, False] and "spk_emb" in first[2].error
    assert_clip(len(parse_wav(first[0].wav)), 8) and first[0].seconds == len(parse_wav(first[0].wav)) / 24000
    engine = worker.chat.engine()
    real_step = engine.step_deltas

    def failing_step() -> list:
        raise RuntimeError("simulated kernel failure")

    engine.step_deltas = failing_step  # every batch fails, then every line alone: each line reports it
    second = run()
    assert all("simulated kernel failure" in second[k].error for k in (0, 1))
    engine.step_deltas = real_step
    third = run()
    assert [third[k].wav for k in (0, 1)] == [first[k].wav for k in (0, 1)]  # same weights, seeds, batch: same bytes
