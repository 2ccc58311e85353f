"""`chattts-velocity serve` flags -> ServerConfig (local and --ray paths), without starting a server or Ray."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")

from chattts_velocity import cli, cluster
from chattts_velocity.cli import serve as cli_serve
from chattts_velocity.demo import DEMO_MAX_NEW_TOKEN
from chattts_velocity.serve import openai_api, ray_serve
from chattts_velocity.speech import StreamOptions

LOW_LATENCY = ["--chunk-steps", "12", "--first-chunk-steps", "8", "--first-lookahead-steps", "16",
               "--max-input-chars", "100"]


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Every run_server call's arguments (`speech`: what the server runs on); the chat loader is never called."""
    calls: list[dict] = []
    monkeypatch.setattr(openai_api, "run_server",
                        lambda speech, config, **kw: calls.append({"speech": speech, "config": config, **kw}))
    monkeypatch.setattr(cli_serve, "load_chat",
                        lambda args, **kw: SimpleNamespace(pipeline=("loaded", args.model, args.dtype, kw)))
    monkeypatch.setattr(cli_serve, "check_port_free", lambda host, port: None)
    return calls


def test_flags_reach_server_config(served: list[dict]) -> None:
    cli.main(["serve", "--port", "8123", *LOW_LATENCY])
    (call,) = served
    assert call["port"] == 8123
    assert call["config"].stream_options == StreamOptions(chunk_steps=12, first_chunk_steps=8, first_lookahead_steps=16)
    assert call["config"].max_input_chars == 100


def test_unset_flags_keep_the_dataclass_defaults(served: list[dict]) -> None:
    cli.main(["serve"])
    config = served[0]["config"]
    defaults = openai_api.ServerConfig()
    assert config.stream_options == StreamOptions() == defaults.stream_options
    assert (config.stream_options.first_chunk_steps, config.stream_options.first_lookahead_steps) == (4, 24)
    assert config.max_input_chars == defaults.max_input_chars
    assert config.max_new_token == DEMO_MAX_NEW_TOKEN  # the demo cap, unchanged by the new flags


@pytest.mark.slow  # imports Ray and its Serve: about 10 s
def test_ray_path_gets_the_same_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    built: list = []
    monkeypatch.setattr(cluster, "init_ray", lambda *a, **kw: None)
    monkeypatch.setattr(ray_serve, "build_app", lambda root, config, options, **kw: built.append((root, config)))
    monkeypatch.setattr(ray_serve, "serve_on_ray", lambda app, **kw: None)
    cli.main(["serve", "--ray", "--model", str(tmp_path), *LOW_LATENCY])
    (root, config), = built
    assert root == tmp_path
    assert config.stream_options == StreamOptions(chunk_steps=12, first_chunk_steps=8, first_lookahead_steps=16)
    assert config.max_input_chars == 100


@pytest.mark.parametrize("flag", ["--chunk-steps", "--first-chunk-steps", "--first-lookahead-steps",
                                  "--max-input-chars"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_bad_value_is_a_one_line_error_naming_the_flag(served: list[dict], flag: str, value: str) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", flag, value])
    message = str(exc.value.code)
    assert message.startswith(f"error: {flag}: ") and value in message and "\n" not in message
    assert "_" not in message.split(":")[1]  # the flag, not the dataclass field name
    assert served == []


def test_non_integer_is_an_argparse_error(served: list[dict], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--first-chunk-steps", "eight"])
    assert exc.value.code == 2
    assert "argument --first-chunk-steps: invalid int value: 'eight'" in capsys.readouterr().err
    assert served == []


def test_dtype_and_compile_reach_the_chat_loader(served: list[dict]) -> None:
    cli.main(["serve", "--dtype", "int8", "--compile"])
    assert served[0]["speech"] == ("loaded", "demo", "int8", {"compile": True})  # the loaded Chat's pipeline


def test_a_port_in_use_bad_model_or_missing_folder_is_one_line(capsys: pytest.CaptureFixture, tmp_path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(SystemExit) as err:
            cli.main(["serve", "--port", str(port)])
    assert str(err.value).startswith("error: --port: cannot listen on 127.0.0.1:") and "\n" not in str(err.value)
    with pytest.raises(SystemExit) as err:
        cli.main(["serve", "--port", "0", "--model", str(tmp_path / "nowhere")])
    assert str(err.value) == f"error: --model: {tmp_path / 'nowhere'} is not a folder; give the folder that " \
                              "contains asset/, or 'demo'"


def test_voices_folder_reaches_server_config(served: list[dict], tmp_path: Path) -> None:
    cli.main(["serve", "--voices", str(tmp_path / "voices")])
    assert served[0]["config"].voices_dir == str(tmp_path / "voices")
    cli.main(["serve"])
    assert served[1]["config"].voices_dir is None  # the library's default: $CHATTTS_VELOCITY_VOICES or ~/.cache


def test_limit_flags_reach_server_config_and_bad_ones_name_their_flag(served: list[dict]) -> None:
    cli.main(["serve", "--text-budget-s", "2.5", "--text-processes", "0", "--header-timeout-s", "3",
              "--body-timeout-s", "7"])
    config = served[0]["config"]
    assert (config.text_budget_s, config.text_processes, config.header_timeout_s, config.body_timeout_s) == \
        (2.5, 0, 3.0, 7.0)
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--body-timeout-s", "0"])
    assert str(exc.value.code).startswith("error: --body-timeout-s: ")


def test_every_limit_flag_reaches_server_config_and_its_help_states_the_real_default(served: list[dict]) -> None:
    values = {name: (kind(2.5) if kind is float else 7) for name, (kind, _) in cli_serve.LIMIT_FLAGS.items()}
    cli.main(["serve", *[a for name, v in values.items() for a in (f"--{name.replace('_', '-')}", str(v))]])
    config = served[0]["config"]
    assert {name: getattr(config, name) for name in values} == values
    defaults = openai_api.ServerConfig()
    for name, (_, text) in cli_serve.LIMIT_FLAGS.items():
        stated = text.rsplit("(default ", 1)[1].split(";")[0].rstrip(")")
        assert float(stated) == getattr(defaults, name), name
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--max-queued-per-client", "0"])
    assert str(exc.value.code).startswith("error: --max-queued-per-client: ")


# ---- every flag from the environment (cli/env_config.py) ------------------------------------------------
def test_every_flag_reads_its_variable_and_a_given_flag_wins(served: list[dict], monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("CHATTTS_VELOCITY_PORT", "8124")
    monkeypatch.setenv("CHATTTS_VELOCITY_CACHE_MB", "5")
    monkeypatch.setenv("CHATTTS_VELOCITY_STRICT_INSTRUCTIONS", "yes")
    monkeypatch.setenv("CHATTTS_VELOCITY_DTYPE", "int8")
    monkeypatch.setenv("CHATTTS_VELOCITY_BODY_TIMEOUT_S", "7.5")
    cli.main(["serve", "--cache-mb", "9"])
    call = served[0]
    assert call["port"] == 8124 and call["speech"][2] == "int8"
    config = call["config"]
    assert (config.cache_mb, config.strict_instructions, config.body_timeout_s) == (9, True, 7.5)
    monkeypatch.setenv("CHATTTS_VELOCITY_STRICT_INSTRUCTIONS", "off")
    cli.main(["serve"])
    assert (served[1]["config"].cache_mb, served[1]["config"].strict_instructions) == (5, False)
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    helped = " ".join(capsys.readouterr().out.split())
    parser = cli.build_parser()._subparsers._group_actions[0].choices["serve"]
    flags = [a.option_strings[-1] for a in parser._actions if a.option_strings and a.dest != "help"]
    assert len(flags) > 30
    for flag in flags:  # each option's help names its variable
        assert f"[env CHATTTS_VELOCITY_{flag[2:].upper().replace('-', '_')}]" in helped, flag


@pytest.mark.parametrize("name, value, why", [
    ("CHATTTS_VELOCITY_PORT", "eighty", "'eighty' is not a valid value for --port"),
    ("CHATTTS_VELOCITY_DTYPE", "fp9", "must be one of"), ("CHATTTS_VELOCITY_RAY", "maybe", "is a switch"),
    ("CHATTTS_VELOCITY_BODY_TIMEOUT_S", "0", None),
])
def test_a_bad_variable_is_a_one_line_error_naming_it(served: list[dict], monkeypatch: pytest.MonkeyPatch,
                                                       name: str, value: str, why: str | None) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve"])
    message = str(exc.value.code)
    assert "\n" not in message and served == []
    if why is None:  # the value's own check names the flag, as when it is given on the command line
        assert message.startswith("error: --body-timeout-s: ")
    else:
        assert message.startswith(f"error: {name}: ") and why in message


def test_a_dotenv_file_sets_what_the_environment_does_not(served: list[dict], monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("# settings\nexport CHATTTS_VELOCITY_MAX_PIECES=9\n"
                                   "CHATTTS_VELOCITY_CACHE_MB = '3'\nCHATTTS_VELOCITY_TEST_ONLY=\"x y\"\n"
                                   "OTHER_APP_KEY=secret\nnot a setting\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CHATTTS_VELOCITY_CACHE_MB", "4")
    monkeypatch.delenv("CHATTTS_VELOCITY_TEST_ONLY", raising=False)
    monkeypatch.delenv("OTHER_APP_KEY", raising=False)
    cli.main(["serve"])
    config = served[0]["config"]
    assert (config.max_pieces, config.cache_mb) == (9, 4)  # the environment wins over the file
    import os

    assert os.environ["CHATTTS_VELOCITY_TEST_ONLY"] == "x y"  # settings without a flag reach the process
    assert "OTHER_APP_KEY" not in os.environ  # other programs' keys are left alone


def test_an_unreadable_dotenv_file_is_a_warning_not_a_failure(served: list[dict], monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / ".env").write_bytes(b"CHATTTS_VELOCITY_CACHE_MB=\xff\xfe\n")
    monkeypatch.chdir(tmp_path)
    cli.main(["serve"])
    assert served[0]["config"].cache_mb == openai_api.ServerConfig().cache_mb
    assert ".env: cannot be read" in capsys.readouterr().err


def test_client_flags_reach_server_config_and_a_bad_keys_file_names_its_flag(served: list[dict],
                                                                            tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("alpha max_queued=40\nbeta\n")
    cli.main(["serve", "--api-keys-file", str(keys), "--trusted-proxy", "10.0.0.5,::1",
              "--allowed-origins", "https://a.example, https://b.example,http://c.example"])
    config = served[0]["config"]
    assert set(config.api_keys()) == {"alpha", "beta"} and config.api_keys()["alpha"].max_queued == 40
    assert config.trusted_proxies == ("10.0.0.5", "::1")
    assert config.allowed_origins == ("https://a.example", "https://b.example", "http://c.example")
    keys.write_text("alpha max_queued=many\n")
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--api-keys-file", str(keys)])
    assert str(exc.value.code).startswith("error: --api-keys-file: ") and "alpha" not in str(exc.value.code)
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--trusted-proxy", "proxy.local"])
    assert str(exc.value.code).startswith("error: --trusted-proxy: ")
