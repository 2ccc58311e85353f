"""Asset discovery and verification: official sha256 map, AssetPaths, find_assets sources, verify_assets."""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest

from chattts_velocity import assets
from chattts_velocity.assets import (
    OFFICIAL_SHA256,
    AssetError,
    AssetPaths,
    find_assets,
    verify_assets,
)

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "chattts-asset"
SPEC = REPO.parent / "shared" / "docs" / "chattts_spec.md"


def _fake_tree(root: Path, files: list[str] | None = None) -> dict[str, str]:
    """root/asset/... with small distinct files; returns rel -> sha256 of what was written."""
    digests = {}
    for n, rel in enumerate(files if files is not None else OFFICIAL_SHA256):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = f"fake {n} {rel}\n".encode() * (n + 1)
        path.write_bytes(data)
        digests[rel] = hashlib.sha256(data).hexdigest()
    return digests


def test_sha256_map_matches_spec_table():
    if not SPEC.is_file():
        pytest.skip(f"spec not found at {SPEC}")
    rows = re.findall(r"^\| (sha256_asset_\w+) \| ([0-9a-f]{64}) \|$", SPEC.read_text(encoding="utf-8"), re.MULTILINE)
    # spec key = "sha256_" + folders joined by "_" + file name with "." -> "_"
    from_spec = {key: digest for key, digest in rows}
    ours = {"sha256_" + rel.replace("/", "_").replace(".", "_"): d for rel, d in OFFICIAL_SHA256.items()}
    assert len(rows) == 9 and ours == from_spec
    assert list(OFFICIAL_SHA256)[:4] == [f"asset/{n}.safetensors" for n in ("Decoder", "DVAE", "Embed", "Vocos")]


def test_shared_real_files_hash_to_official_values():
    if not (SHARED / "gpt" / "config.json").is_file():
        pytest.skip(f"real assets not found at {SHARED}")
    for rel in ("gpt/config.json", "tokenizer/special_tokens_map.json", "tokenizer/tokenizer_config.json",
                "tokenizer/tokenizer.json"):
        assert assets.file_sha256(SHARED / rel) == OFFICIAL_SHA256["asset/" + rel]


def test_file_sha256_chunked_and_cache_invalidated_on_change(tmp_path, monkeypatch):
    path = tmp_path / "big.bin"
    data = os.urandom((1 << 22) * 2 + 12345)  # spans several read chunks
    path.write_bytes(data)
    expected = hashlib.sha256(data).hexdigest()
    digests = []  # one per time the file is actually read
    real_sha256 = hashlib.sha256
    monkeypatch.setattr(hashlib, "sha256", lambda *a: digests.append(1) or real_sha256(*a))
    assert assets.file_sha256(path) == expected and len(digests) == 1
    assert assets.file_sha256(path) == expected and len(digests) == 1  # cached: not read again
    path.write_bytes(data + b"x")
    assert assets.file_sha256(path) == real_sha256(data + b"x").hexdigest() and len(digests) == 2


def test_asset_paths_from_root_accepts_both_forms(tmp_path):
    _fake_tree(tmp_path)
    outer, inner = AssetPaths.from_root(tmp_path), AssetPaths.from_root(tmp_path / "asset")
    assert outer == inner
    assert outer.root == tmp_path.resolve()
    assert outer.gpt_config == tmp_path.resolve() / "asset" / "gpt" / "config.json"
    assert outer.tokenizer_dir == tmp_path.resolve() / "asset" / "tokenizer"
    assert outer.files()["asset/tokenizer/tokenizer.json"].is_file() and outer.missing() == []


def test_asset_paths_from_root_custom_named_asset_dir_and_empty_dir(tmp_path):
    (tmp_path / "weights" / "gpt").mkdir(parents=True)
    paths = AssetPaths.from_root(tmp_path / "weights")
    assert paths.gpt_dir == tmp_path.resolve() / "weights" / "gpt"
    assert paths.embed == tmp_path.resolve() / "weights" / "Embed.safetensors"
    empty = AssetPaths.from_root(tmp_path / "nothing")
    assert empty.embed == tmp_path.resolve() / "nothing" / "asset" / "Embed.safetensors"
    assert len(empty.missing()) == 9


def test_verify_passes_with_patched_map_and_lists_every_mismatch_otherwise(tmp_path):
    digests = _fake_tree(tmp_path)
    paths = AssetPaths.from_root(tmp_path)
    verify_assets(paths, expected_sha256=digests)
    verify_assets(paths, check_sha256=False)  # existence only: fake files pass
    with pytest.raises(AssetError) as info:
        verify_assets(paths)
    assert set(info.value.mismatched) == set(OFFICIAL_SHA256) and info.value.missing == ()
    for rel, expected in OFFICIAL_SHA256.items():
        assert f"{rel} ({paths.files()[rel]}): expected {expected}, got {digests[rel]}" in str(info.value)


def test_verify_lists_all_missing_and_mismatching_files(tmp_path):
    digests = _fake_tree(tmp_path)
    paths = AssetPaths.from_root(tmp_path)
    gone = ["asset/Decoder.safetensors", "asset/tokenizer/tokenizer.json"]
    for rel in gone:
        (tmp_path / rel).unlink()
    (tmp_path / "asset/gpt/config.json").write_text("{}")
    with pytest.raises(AssetError) as info:
        verify_assets(paths, expected_sha256=digests)
    err = info.value
    assert isinstance(err, FileNotFoundError) and isinstance(err, ValueError)
    assert list(err.missing) == gone and list(err.mismatched) == ["asset/gpt/config.json"]
    msg = str(err)
    assert all(f"missing: {rel}" in msg for rel in gone) and "sha256 mismatch: asset/gpt/config.json" in msg
    assert "hf download 2Noise/ChatTTS --local-dir" in msg and "verify=False" in msg
    assert "demo-assets" in msg


def test_find_assets_rejects_unknown_source_and_missing_custom_path(tmp_path):
    with pytest.raises(ValueError, match="source"):
        find_assets("modelscope")
    with pytest.raises(ValueError, match="custom_path"):
        find_assets("custom")
    assert find_assets("custom", tmp_path / "asset") == AssetPaths.from_root(tmp_path)


def test_find_local_searches_cwd_then_models_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert find_assets("local").root == tmp_path.resolve()  # nothing anywhere: cwd, verify lists all missing
    _fake_tree(tmp_path / "models" / "chattts")
    assert find_assets("local").root == (tmp_path / "models" / "chattts").resolve()
    _fake_tree(tmp_path)
    assert find_assets("local").root == tmp_path.resolve()
    assert find_assets("local", custom_path=tmp_path / "models" / "chattts").root.name == "chattts"


def _fake_hf_cache(cache: Path) -> Path:
    snaps = cache / "models--2Noise--ChatTTS" / "snapshots"
    for name, mtime in (("aaaa-old", 1_000_000), ("zzzz-older", 500_000), ("mmmm-new", 2_000_000)):
        _fake_tree(snaps / name, ["asset/gpt/config.json"])
        os.utime(snaps / name, (mtime, mtime))
    return snaps


def test_huggingface_newest_snapshot_wins_in_custom_cache(tmp_path):
    snaps = _fake_hf_cache(tmp_path / "cache")
    paths = find_assets("huggingface", custom_path=tmp_path / "cache")
    assert paths.root == (snaps / "mmmm-new").resolve() and paths.gpt_config.is_file()


def test_huggingface_default_cache_from_hf_home(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    snaps = _fake_hf_cache(tmp_path / "hf" / "hub")
    assert find_assets("huggingface").root == (snaps / "mmmm-new").resolve()


def test_huggingface_downloads_when_no_snapshot(tmp_path, monkeypatch):
    hub = pytest.importorskip("huggingface_hub")
    calls = []

    def fake_download(repo_id: str, **kwargs) -> str:
        calls.append((repo_id, kwargs))
        _fake_tree(tmp_path / "dl")
        return str(tmp_path / "dl")

    monkeypatch.setattr(hub, "snapshot_download", fake_download)
    paths = find_assets("huggingface", custom_path=tmp_path / "empty-cache")
    assert paths.root == (tmp_path / "dl").resolve()
    repo_id, kwargs = calls[0]
    assert repo_id == "2Noise/ChatTTS" and kwargs["cache_dir"] == str(tmp_path / "empty-cache")
    assert sorted(kwargs["allow_patterns"]) == ["*.json", "*.safetensors", "*.yaml"]
    find_assets("huggingface", custom_path=tmp_path / "empty-cache", force_redownload=True)
    assert calls[1][1]["force_download"] is True


def test_huggingface_download_failure_explains_how_to_copy_files(tmp_path, monkeypatch):
    hub = pytest.importorskip("huggingface_hub")

    def offline(repo_id: str, **kwargs) -> str:
        raise OSError("network is unreachable")

    monkeypatch.setattr(hub, "snapshot_download", offline)
    with pytest.raises(AssetError, match="network is unreachable") as info:
        find_assets("huggingface", custom_path=tmp_path)
    assert "hf download 2Noise/ChatTTS" in str(info.value) and "copy" in str(info.value)
