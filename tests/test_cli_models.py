"""`--model DIR` on the command line: demo folders load by path, other custom folders need --no-verify."""
from __future__ import annotations

import shutil
import wave
from pathlib import Path

import pytest

from chattts_velocity import cli
from chattts_velocity.demo import is_demo_folder

SAY = ["--max-new-token", "6", "--seed", "1"]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("models") / "mine"
    cli.main(["demo-assets", str(root), "--tiny"])
    return root


def frames(path: Path) -> int:
    with wave.open(str(path)) as w:
        return w.getnframes()


def test_demo_assets_then_say_by_path(demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert is_demo_folder(demo_dir)
    out = tmp_path / "hi.wav"
    cli.main(["say", "Hello there.", "-o", str(out), "--model", str(demo_dir), *SAY])
    assert frames(out) > 0
    assert "holds random demo weights" in capsys.readouterr().err


def test_other_custom_weights_are_refused_in_one_line_naming_no_verify(demo_dir: Path, tmp_path: Path) -> None:
    custom = tmp_path / "finetuned"
    shutil.copytree(demo_dir, custom)
    (custom / "asset" / "demo-weights.json").unlink()  # weights of unknown origin
    out = tmp_path / "x.wav"
    with pytest.raises(SystemExit) as err:
        cli.main(["say", "Hello.", "-o", str(out), "--model", str(custom), *SAY])
    message = str(err.value)
    assert message.startswith(f"error: --model {custom}: not the official ChatTTS files") and "\n" not in message
    assert "--no-verify" in message and not out.exists()
    cli.main(["say", "Hello.", "-o", str(out), "--model", str(custom), "--no-verify", *SAY])
    assert frames(out) > 0


def test_say_checks_the_output_folder_before_synthesising(demo_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as err:
        cli.main(["say", "Hello.", "-o", str(tmp_path / "missing" / "x.wav"), "--model", str(demo_dir), *SAY])
    assert str(err.value).startswith("error: --output:") and "nothing was synthesised" in str(err.value)


def test_every_model_command_has_the_same_model_flags() -> None:
    parser = cli.build_parser()
    commands = parser._subparsers._group_actions[0].choices  # argparse keeps subparsers here
    for name in ("say", "demo", "export", "serve", "webui"):
        flags = {opt for action in commands[name]._actions for opt in action.option_strings}
        assert {"--model", "--tiny", "--no-verify", "--dtype", "--backend", "--kv-cache-dtype"} <= flags, name


@pytest.mark.parametrize("reason,want", [(None, "int8"), ("this CPU lacks avx2, fma", "float32")])
def test_auto_precision_is_the_fastest_measured_and_said(monkeypatch, capsys, reason, want) -> None:
    import argparse

    from chattts_velocity.cli import common
    from chattts_velocity.model import kernels

    monkeypatch.setattr(kernels, "unsupported", lambda: reason)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    args = argparse.Namespace(dtype="auto")
    assert common.resolve_dtype(args) == want == args.dtype
    assert f"precision: {want}" in capsys.readouterr().err
    explicit = argparse.Namespace(dtype="float32")
    assert common.resolve_dtype(explicit) == "float32" and capsys.readouterr().err == ""


def test_python_loads_a_demo_folder_by_path_too(demo_dir: Path, tmp_path: Path) -> None:
    from chattts_velocity import Chat
    from chattts_velocity.assets import AssetError

    assert Chat().load(source="custom", custom_path=demo_dir)  # verify=True: the marker says there is nothing to check
    custom = tmp_path / "custom"
    shutil.copytree(demo_dir, custom)
    (custom / "asset" / "demo-weights.json").unlink()
    with pytest.raises(AssetError, match="verify=False"):
        Chat().load(source="custom", custom_path=custom)


def test_backend_flag_reaches_the_engine_and_bad_choices_are_one_line(demo_dir: Path, tmp_path: Path) -> None:
    from chattts_velocity.cli import common

    args = cli.build_parser().parse_args(["say", "x", "--model", str(demo_dir), "--backend", "torch"])
    chat = common.load_chat(args)
    assert chat.engine().metrics()["backend"] == "torch"
    with pytest.raises(SystemExit) as err:
        cli.main(["say", "x", "-o", str(tmp_path / "x.wav"), "--model", str(demo_dir), "--dtype", "float32",
                  "--backend", "cpu"])
    assert str(err.value).startswith("error: backend: 'cpu' cannot run here") and "\n" not in str(err.value)


def test_kv_cache_dtype_flag_reaches_the_engine_config_and_refusals_are_one_line(demo_dir: Path, tmp_path: Path) -> None:
    from chattts_velocity.cli import common

    args = cli.build_parser().parse_args(["say", "x", "--model", str(demo_dir), "--kv-cache-dtype", "int8"])
    assert common.engine_options(args) == {"backend": "auto", "kv_cache_dtype": "int8"}
    with pytest.raises(SystemExit) as err:  # float32 engines keep a float32 cache
        cli.main(["say", "x", "-o", str(tmp_path / "x.wav"), "--model", str(demo_dir), "--dtype", "float32",
                  "--kv-cache-dtype", "int8"])
    assert str(err.value).startswith("error: kv_cache_dtype:") and "\n" not in str(err.value)
