"""Errors before work: a command refuses what it cannot do in one line naming the flag, before the weights load
and before any synthesis."""
from __future__ import annotations

from pathlib import Path

import pytest

from chattts_velocity import cli
from chattts_velocity.cli import common


@pytest.fixture
def no_model_load(monkeypatch):
    """Resolving or loading a model fails the test: every refusal here must come first."""
    monkeypatch.setattr(common, "ensure_model", lambda *a: pytest.fail("the model was resolved"))


def refusal(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as err:
        cli.main(argv)
    message = str(err.value)
    assert message.startswith("error: ") and "\n" not in message and "Errno" not in message
    return message


def test_say_checks_that_the_output_file_can_be_written_before_synthesising(no_model_load, tmp_path: Path) -> None:
    message = refusal(["say", "Hello.", "-o", "/proc/x.wav"])
    assert message.startswith("error: --output: cannot write /proc/x.wav (") and "nothing was synthesised" in message
    writable = tmp_path / "fine.wav"
    common.check_writable(writable, "--output")
    assert not writable.exists()  # the probe leaves nothing behind


def test_export_of_a_missing_input_file_is_one_line(no_model_load, tmp_path: Path) -> None:
    message = refusal(["export", str(tmp_path / "nosuch.txt"), "-o", str(tmp_path / "out")])
    assert message == (f"error: input: {tmp_path / 'nosuch.txt'} is not a file; give a text file (one utterance per "
                       "line), a JSONL file, or '-' for stdin")


def test_backend_triton_without_a_gpu_fails_before_the_weights_load_in_the_flags_spelling(no_model_load, monkeypatch,
                                                                                       tmp_path: Path) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    message = refusal(["say", "Hello.", "-o", str(tmp_path / "x.wav"), "--backend", "triton"])
    assert message.startswith("error: --backend triton: ") and "backend=" not in message


def test_an_os_error_is_its_file_and_reason(monkeypatch, tmp_path: Path) -> None:
    import importlib

    main_module = importlib.import_module("chattts_velocity.cli.main")
    locked = tmp_path / "locked.wav"

    def fail(args) -> None:
        raise PermissionError(13, "Permission denied", str(locked))

    monkeypatch.setattr(main_module, "cmd_say", fail)
    assert refusal(["say", "x", "-o", "x.wav"]) == f"error: {locked}: Permission denied"
