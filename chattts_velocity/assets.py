"""Official ChatTTS assets: find the `asset/` folder (local dir, models/, HF cache) and verify it.

In: a source name and an optional path. Out: an AssetPaths with every file of the official layout.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

HF_REPO_ID = "2Noise/ChatTTS"
HF_ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.yaml"]
SOURCES = ("local", "huggingface", "custom")
# Searched in order by source="local" without custom_path (relative to the working directory).
LOCAL_CANDIDATES = (".", "models/chattts", "models")

# Relative path -> sha256 of the official file; also the order of the check (upstream's).
OFFICIAL_SHA256: dict[str, str] = {
    "asset/Decoder.safetensors": "77aa55e0a977949c4733df3c6f876fa85860d3298cba63295a7bc6901729d4e0",
    "asset/DVAE.safetensors": "1d0b044a8368c0513100a2eca98456b289e6be6a18b7a63be1bcaa315ea874d9",
    "asset/Embed.safetensors": "2ff0be7134934155741b643b74e32fb6bf3eec41257984459b2ed60cdb4c48b0",
    "asset/Vocos.safetensors": "07e5561491cce41f7f90cfdb94b2ff263ff5742c3d89339db99b17ad82cc3f44",
    "asset/gpt/config.json": "0aaa1ecd96c49ad4f473459eb1982fa7ad79fa5de08cde2781bf6ad1f9a0c236",
    "asset/gpt/model.safetensors": "cd0806fd971f52f6a22c923ec64982b305e817bcc41ca83417fcf9141b984a0f",
    "asset/tokenizer/special_tokens_map.json": "bd0ac9d9bb1657996b5c5fbcaa7d80f8de530d01a283da97f89deae5b1b8d011",
    "asset/tokenizer/tokenizer_config.json": "43e9d658b554fa5ee8d8e1d763349323bfef1ed7a89c0794220ab8861387d421",
    "asset/tokenizer/tokenizer.json": "843838a64e121e23e774cc75874c6fe862198d9f7dd43747914633a8fd89c20e",
}

_FIX_HINT = (
    "To fix: download the official weights with\n"
    f"    hf download {HF_REPO_ID} --local-dir DIR\n"
    "and load with source='custom', custom_path=DIR (or copy an existing `asset/` folder to DIR/asset; "
    "see models/README.md).\n"
    "For custom or fine-tuned weights pass verify=False (command line: --no-verify): their hashes never match "
    "the official ones. Folders written by `chattts-velocity demo-assets` load unverified by themselves."
)


class AssetError(FileNotFoundError, ValueError):
    """Assets missing (a FileNotFoundError) or not the official files (also a ValueError)."""

    def __init__(self, message: str, missing: tuple[str, ...] = (), mismatched: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.missing = missing  # relative paths, e.g. "asset/gpt/config.json"
        self.mismatched = mismatched


@dataclass(frozen=True)
class AssetPaths:
    """Absolute paths of the official layout; `root` is the folder that contains `asset/`."""

    root: Path
    gpt_dir: Path
    gpt_config: Path
    gpt_weights: Path
    embed: Path
    dvae: Path
    decoder: Path
    vocos: Path
    tokenizer_dir: Path

    @classmethod
    def from_root(cls, root: str | Path) -> AssetPaths:
        """`root` may contain `asset/`, or be the asset folder itself (holds gpt/, tokenizer/, *.safetensors)."""
        root = Path(root).expanduser().resolve()
        asset = root / "asset"
        if not asset.is_dir() and _looks_like_asset_dir(root):
            asset = root
        return cls(
            root=asset.parent,
            gpt_dir=asset / "gpt",
            gpt_config=asset / "gpt" / "config.json",
            gpt_weights=asset / "gpt" / "model.safetensors",
            embed=asset / "Embed.safetensors",
            dvae=asset / "DVAE.safetensors",
            decoder=asset / "Decoder.safetensors",
            vocos=asset / "Vocos.safetensors",
            tokenizer_dir=asset / "tokenizer",
        )

    @property
    def asset_dir(self) -> Path:
        return self.embed.parent

    def files(self) -> dict[str, Path]:
        """Relative key of OFFICIAL_SHA256 -> absolute path, in the check order."""
        return {rel: self.asset_dir / rel.removeprefix("asset/") for rel in OFFICIAL_SHA256}

    def missing(self) -> list[str]:
        return [rel for rel, path in self.files().items() if not path.is_file()]


DEMO_MARKER = "demo-weights.json"  # in asset/, written last by demo-assets: a complete demo folder carries it
DEMO_KIND = "chattts_velocity random demo weights"


def is_demo_folder(root: str | Path) -> bool:
    """True for a folder written by `chattts-velocity demo-assets` (random weights; nothing official to verify)."""
    try:
        marker = json.loads((Path(root) / "asset" / DEMO_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("kind") == DEMO_KIND


def read_safetensors(path: str | Path, what: str) -> dict[str, torch.Tensor]:
    """Every tensor of a .safetensors checkpoint on CPU; a missing or damaged file is an error naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what}: {path} does not exist")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"{what}: {path} is not a readable safetensors file ({exc})") from None


def check_state_dict(what: str, state_dict: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor],
                     fix: str = "") -> None:
    """The one check of a checkpoint's tensors against a module's state dict (its keys and shapes), before a
    strict load: a ValueError naming `what`, the first keys that differ, and `fix` (what to pass instead)."""
    def first(keys: list[str]) -> str:
        return f"{keys[:8]}{' ...' if len(keys) > 8 else ''}"

    missing, unexpected = sorted(set(expected) - set(state_dict)), sorted(set(state_dict) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{what}: missing keys {first(missing)}, unexpected keys {first(unexpected)}{fix}")
    wrong = [f"{k}: file {tuple(v.shape)} vs module {tuple(expected[k].shape)}" for k, v in state_dict.items()
             if v.shape != expected[k].shape]
    if wrong:
        raise ValueError(f"{what}: shapes differ from the module's {wrong[:4]}{fix}")


def _looks_like_asset_dir(folder: Path) -> bool:
    if folder.name == "asset":
        return True
    names = {"gpt", "tokenizer", "Embed.safetensors", "DVAE.safetensors", "Decoder.safetensors", "Vocos.safetensors"}
    return folder.is_dir() and any((folder / name).exists() for name in names)


def find_assets(
    source: str = "local", custom_path: str | Path | None = None, force_redownload: bool = False
) -> AssetPaths:
    """Locate the assets of `source` ("local", "huggingface" or "custom"); does not verify them."""
    if custom_path is not None and Path(custom_path).expanduser().is_file():
        raise ValueError(f"custom_path: {custom_path} is a file; give the folder that contains asset/ "
                         "(or the asset/ folder itself)")
    if source == "local":
        return _find_local(custom_path, force_redownload)
    if source == "huggingface":
        return _find_huggingface(custom_path, force_redownload)
    if source == "custom":
        if custom_path is None:
            raise ValueError("custom_path: required when source='custom' (the folder that contains asset/)")
        return AssetPaths.from_root(custom_path)
    raise ValueError(f"source: must be one of {', '.join(map(repr, SOURCES))}, got {source!r}")


def _find_local(custom_path: str | Path | None, force_redownload: bool) -> AssetPaths:
    if custom_path is not None:
        paths = AssetPaths.from_root(custom_path)
    else:
        candidates = [AssetPaths.from_root(Path.cwd() / rel) for rel in LOCAL_CANDIDATES]
        complete = [p for p in candidates if not p.missing()]
        started = [p for p in candidates if p.asset_dir.is_dir()]
        paths = (complete or started or candidates)[0]
    if force_redownload:
        _hf_download(local_dir=paths.root, force_download=True)
    return paths


def hf_snapshots_dir(custom_path: str | Path | None = None) -> Path:
    """`<custom_path>/models--2Noise--ChatTTS/snapshots`, else the one in the default HF hub cache."""
    if custom_path is not None:
        cache = Path(custom_path).expanduser()
    elif os.environ.get("HF_HUB_CACHE"):
        cache = Path(os.environ["HF_HUB_CACHE"]).expanduser()
    else:
        cache = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser() / "hub"
    return cache / ("models--" + HF_REPO_ID.replace("/", "--")) / "snapshots"


def _find_huggingface(custom_path: str | Path | None, force_redownload: bool) -> AssetPaths:
    snapshots = hf_snapshots_dir(custom_path)
    entries = [p for p in snapshots.iterdir() if p.is_dir()] if snapshots.is_dir() else []
    if entries and not force_redownload:
        return AssetPaths.from_root(max(entries, key=lambda p: p.stat().st_mtime))
    folder = _hf_download(cache_dir=custom_path, force_download=force_redownload)
    return AssetPaths.from_root(folder)


def _hf_download(
    cache_dir: str | Path | None = None, local_dir: str | Path | None = None, force_download: bool = False
) -> Path:
    where = f"into {local_dir}" if local_dir is not None else f"(cache {hf_snapshots_dir(cache_dir).parents[1]})"
    try:
        import huggingface_hub
    except ImportError as exc:
        raise AssetError(
            f"cannot download {HF_REPO_ID} {where}: huggingface_hub is not installed "
            f"(pip install huggingface_hub).\n{_FIX_HINT}"
        ) from exc
    local = None if local_dir is None else str(local_dir)
    cache = None if local_dir is not None or cache_dir is None else str(cache_dir)  # a local_dir needs no cache
    try:
        return Path(huggingface_hub.snapshot_download(repo_id=HF_REPO_ID, allow_patterns=HF_ALLOW_PATTERNS,
                                                      force_download=force_download, local_dir=local, cache_dir=cache))
    except Exception as exc:  # network, auth, disk: all end in the same advice
        raise AssetError(
            f"could not download {HF_REPO_ID} {where}: {type(exc).__name__}: {exc}\n"
            "Without network access, run the download on another machine and copy the folder in.\n" + _FIX_HINT
        ) from exc


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file, read in chunks; cached by (path, size, mtime) for this process."""
    path = Path(path).resolve()
    st = path.stat()
    return _cached_sha256(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _cached_sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def verify_assets(
    paths: AssetPaths, check_sha256: bool = True, expected_sha256: Mapping[str, str] | None = None
) -> None:
    """Check every file of the layout; raise one AssetError listing all missing and mismatching files."""
    expected = OFFICIAL_SHA256 if expected_sha256 is None else expected_sha256
    missing: list[str] = []
    mismatched: list[str] = []
    lines: list[str] = []
    for rel, path in paths.files().items():
        if not path.is_file():
            missing.append(rel)
            lines.append(f"  missing: {rel} ({path})")
        elif check_sha256 and rel in expected and (got := file_sha256(path)) != expected[rel]:
            mismatched.append(rel)
            lines.append(f"  sha256 mismatch: {rel} ({path}): expected {expected[rel]}, got {got}")
    if not lines:
        return
    head = f"ChatTTS assets under {paths.asset_dir} are incomplete or are not the official files:"
    raise AssetError("\n".join([head, *lines, _FIX_HINT]), tuple(missing), tuple(mismatched))
