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

    args = cli.build_parser().parse_args(["say", "x", "-o", "x.wav", "--model", str(demo_dir), "--backend", "torch"])
    chat = common.load_chat(args)
    assert chat.engine().metrics()["backend"] == "torch"


@pytest.mark.parametrize("reason,dtype,says", [
    ("this CPU lacks avx512f, avx512bw, avx512_bf16", "bfloat16", "this CPU lacks avx512f"),
    ("this CPU lacks avx512f, avx512bw, avx512_bf16", "float32", "this CPU lacks avx512f"),
    (None, "float32", "add --dtype bfloat16")])
def test_backend_cpu_refusal_names_the_real_cause_before_loading(monkeypatch, tmp_path: Path, reason: str | None,
                                                                 dtype: str, says: str) -> None:
    from chattts_velocity.cli import common
    from chattts_velocity.model import kernels

    monkeypatch.setattr(kernels, "unsupported", lambda: reason)
    monkeypatch.setattr(common, "ensure_model", lambda *a: pytest.fail("the model was resolved"))
    with pytest.raises(SystemExit) as err:
        cli.main(["say", "x", "-o", str(tmp_path / "x.wav"), "--dtype", dtype, "--backend", "cpu"])
    message = str(err.value)
    assert message.startswith("error: --backend cpu:") and says in message and "\n" not in message
    assert "KV cache" not in message  # following the old advice (bfloat16) failed on such a CPU


def test_kv_cache_dtype_flag_reaches_the_engine_config_and_refusals_are_one_line(demo_dir: Path,
                                                                                  tmp_path: Path) -> None:
    from chattts_velocity.cli import common

    args = cli.build_parser().parse_args(["say", "x", "-o", "x.wav", "--model", str(demo_dir),
                                          "--kv-cache-dtype", "int8"])
    assert common.engine_options(args) == {"backend": "auto", "kv_cache_dtype": "int8"}
    with pytest.raises(SystemExit) as err:  # float32 engines keep a float32 cache
        cli.main(["say", "x", "-o", str(tmp_path / "x.wav"), "--model", str(demo_dir), "--dtype", "float32",
                  "--kv-cache-dtype", "int8"])
    assert str(err.value).startswith("error: kv_cache_dtype:") and "\n" not in str(err.value)


def test_every_option_of_every_command_has_help() -> None:
    commands = cli.build_parser()._subparsers._group_actions[0].choices
    for name, parser in commands.items():
        for action in parser._actions:
            assert action.help, f"{name} {action.option_strings or action.dest}"


@pytest.mark.parametrize("command", ["say", "demo", "export", "serve", "webui"])
def test_one_demo_step_cap_decided_by_the_marker_not_the_name(command: str, demo_dir: Path, tmp_path: Path) -> None:
    from chattts_velocity.cli import common
    from chattts_velocity.demo import DEMO_MAX_NEW_TOKEN
    from chattts_velocity.schema import MAX_NEW_TOKEN

    real = tmp_path / "demo"  # a folder called demo without the marker: not demo weights
    (real / "asset").mkdir(parents=True)
    head = {"say": ["say", "x", "-o", "x.wav"], "export": ["export", "in.txt", "-o", "out"]}.get(command, [command])
    cap = {}
    for model in ("demo", str(demo_dir), str(real)):
        args = cli.build_parser().parse_args([*head, "--model", model])
        cap[model] = common.max_new_token(args)
    assert cap == {"demo": DEMO_MAX_NEW_TOKEN, str(demo_dir): DEMO_MAX_NEW_TOKEN, str(real): MAX_NEW_TOKEN}
    assert cap[str(real)] is MAX_NEW_TOKEN  # the library's default itself: the CLI keeps no copy of its own
    args = cli.build_parser().parse_args([*head, "--model", str(demo_dir), "--max-new-token", "7"])
    assert common.max_new_token(args) == 7


def test_serve_config_takes_the_demo_cap_of_a_demo_folder(demo_dir: Path) -> None:
    pytest.importorskip("fastapi")
    from chattts_velocity.cli.serve import server_config
    from chattts_velocity.demo import DEMO_MAX_NEW_TOKEN

    args = cli.build_parser().parse_args(["serve", "--model", str(demo_dir)])
    assert server_config(args).max_new_token == DEMO_MAX_NEW_TOKEN


def test_say_needs_an_output_file_and_words(monkeypatch, tmp_path: Path, capsys) -> None:
    import sys

    cli_main = sys.modules["chattts_velocity.cli.main"]  # the package's `main` attribute is the function
    with pytest.raises(SystemExit) as err:
        cli.main(["say", "Hello."])
    assert err.value.code == 2 and "-o/--output" in capsys.readouterr().err
    monkeypatch.setattr(cli_main, "load_chat", lambda *a, **kw: pytest.fail("the model loaded"))
    for text in ("", "  \n"):
        with pytest.raises(SystemExit) as err:
            cli.main(["say", text, "-o", str(tmp_path / "x.wav")])
        assert str(err.value).startswith("error: text: empty")


def test_demo_weights_live_in_one_per_user_folder(monkeypatch, tmp_path: Path, capsys) -> None:
    from chattts_velocity.demo import demo_model_dir, ensure_model

    monkeypatch.setenv("CHATTTS_VELOCITY_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert demo_model_dir(tiny=True) == tmp_path / "cache" / "demo-tiny"
    root, verify = ensure_model("demo", tiny=True)
    assert root == tmp_path / "cache" / "demo-tiny" and is_demo_folder(root) and not verify
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # nothing in the working directory
    assert f"writing random demo weights to {root}" in capsys.readouterr().err
    assert ensure_model("demo", tiny=True) == (root, False)  # written once; later runs say where it is
    assert f"random demo weights from {root}" in capsys.readouterr().err
    monkeypatch.delenv("CHATTTS_VELOCITY_CACHE")
    assert demo_model_dir() == Path.home() / ".cache" / "chattts_velocity" / "demo"


def test_demo_assets_refuses_a_folder_holding_other_files(demo_dir: Path, tmp_path: Path) -> None:
    official = tmp_path / "chattts"
    shutil.copytree(demo_dir, official)
    (official / "asset" / "demo-weights.json").unlink()  # e.g. downloaded weights: the same file names
    before = (official / "asset" / "Vocos.safetensors").read_bytes()
    with pytest.raises(SystemExit) as err:
        cli.main(["demo-assets", str(official), "--tiny"])
    message = str(err.value)
    assert message.startswith(f"error: demo-assets: {official} already holds files that are not demo weights")
    assert "--force" in message and "\n" not in message
    assert (official / "asset" / "Vocos.safetensors").read_bytes() == before
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    with pytest.raises(SystemExit, match="todo.txt"):
        cli.main(["demo-assets", str(notes), "--tiny"])
    cli.main(["demo-assets", str(notes), "--tiny", "--force"])
    assert is_demo_folder(notes) and (notes / "todo.txt").read_text() == "mine"


def test_demo_assets_rewrites_its_own_folder_and_names_a_file_given_as_folder(demo_dir: Path, tmp_path: Path) -> None:
    cli.main(["demo-assets", str(demo_dir), "--tiny", "--seed", "0"])  # its own output: no --force needed
    assert is_demo_folder(demo_dir)
    readme = tmp_path / "README.md"
    readme.write_text("# not a folder")
    with pytest.raises(SystemExit) as err:
        cli.main(["demo-assets", str(readme), "--tiny"])
    assert str(err.value) == f"error: demo-assets: {readme} is a file; give a folder (it is created if missing)"


def test_package_warnings_print_in_one_line(monkeypatch) -> None:
    import warnings

    from chattts_velocity.cli import common

    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)
    common.package_warnings_in_one_line()
    inside = str(common.PACKAGE_DIR / "model" / "kernels" / "__init__.py")
    text = "chattts_velocity: CPU decode kernels unavailable: this CPU lacks avx512f; using torch's kernels"
    assert warnings.formatwarning(text, RuntimeWarning, inside, 45, "warnings.warn(...)") == f"warning: {text}\n"
    outside = warnings.formatwarning("deprecated", DeprecationWarning, "/x/transformers/y.py", 3, "src")
    assert "DeprecationWarning" in outside and "/x/transformers/y.py:3" in outside


def test_bench_has_no_verify_and_picks_the_auto_precision(monkeypatch, demo_dir: Path, tmp_path: Path) -> None:
    import argparse

    from chattts_velocity.assets import AssetError
    from chattts_velocity.cli.main import bench_module
    from chattts_velocity.model import kernels

    bench = bench_module()
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    monkeypatch.setattr(kernels, "unsupported", lambda: "this CPU lacks avx512_bf16")
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    args = bench.resolve(parser.parse_args(["--quick"]))
    assert args.dtype == "float32" and args.decode_dtype == "float32"  # what --dtype auto picks on every command
    custom = tmp_path / "custom"
    shutil.copytree(demo_dir, custom)
    (custom / "asset" / "demo-weights.json").unlink()
    from benchmarks.lib.runs import load_suite

    with pytest.raises(AssetError, match="no-verify"):
        load_suite(parser.parse_args(["--model", str(custom)]))
    assert parser.parse_args(["--no-verify"]).no_verify


def test_the_demo_texts_normalise_without_a_warning(caplog) -> None:
    import logging

    from chattts_velocity.cli.main import DEMO_TEXTS
    from chattts_velocity.text.normalizer import Normalizer, invalid_characters

    normalize = Normalizer()
    with caplog.at_level(logging.WARNING):
        spoken = [normalize(text) for text in DEMO_TEXTS]
    assert caplog.records == [] and not any(invalid_characters(text) for text in spoken)
    assert any("!" in text for text in DEMO_TEXTS)  # the punctuation a reader expects stays in the examples
