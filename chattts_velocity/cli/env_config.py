"""Every flag of a command from the environment: `--cache-mb` is also CHATTTS_VELOCITY_CACHE_MB, and so on.

One rule for every flag: the variable is CHATTTS_VELOCITY_ plus the flag's long name upper-cased, dashes as
underscores. A flag given on the command line wins over its variable; a variable wins over a `.env` file in the
working directory (KEY=VALUE lines; `#` comments, blank lines, `export ` and quotes allowed; only keys starting with
CHATTTS_VELOCITY_ are read). A variable's value is checked like the flag's (its type, its choices; "1", "true",
"yes", "on" or "0", "false", "no", "off" for a switch), and a bad one is an error naming the variable.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "CHATTTS_VELOCITY_"
DOTENV = ".env"
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


@dataclass(frozen=True)
class EnvValue:
    """A flag's default taken from a variable: converted (and checked) by resolve_env after parsing."""

    name: str
    raw: str
    action: argparse.Action

    def __str__(self) -> str:  # what a help text's %(default)s shows
        return self.raw


def env_name(action: argparse.Action) -> str | None:
    """CHATTTS_VELOCITY_<FLAG> for an option with a long name; None for positionals, --help and the like."""
    long = [option for option in action.option_strings if option.startswith("--")]
    if not long or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
        return None
    return PREFIX + long[0][2:].upper().replace("-", "_")


def read_dotenv(path: Path) -> dict[str, str]:
    """The CHATTTS_VELOCITY_ keys of a .env file ({} if there is none)."""
    if not path.is_file():
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:  # every command builds the serve parser: never fail them all
        print(f"warning: {path}: cannot be read ({exc}); its settings are not used", file=sys.stderr)
        return {}
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        key, value = key.strip(), value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if key.startswith(PREFIX):
            values[key] = value
    return values


def settings_environment(cwd: Path | None = None) -> dict[str, str]:
    """The variables the flags read: the .env file's, then the process environment's over them."""
    return {**read_dotenv((cwd or Path.cwd()) / DOTENV), **os.environ}


def add_env_defaults(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Name each option's variable in its help, and make a set variable the option's default."""
    for action in parser._actions:
        name = env_name(action)
        if name is None:
            continue
        if action.help is not None and action.help != argparse.SUPPRESS:
            action.help = f"{action.help} [env {name}]"
        if name in environ:
            action.default = EnvValue(name, environ[name], action)


def resolve_env(args: argparse.Namespace) -> None:
    """Turn each default that came from a variable into the flag's value; ValueError naming the variable."""
    for dest, value in vars(args).items():
        if isinstance(value, EnvValue):
            setattr(args, dest, _convert(value))


def _convert(value: EnvValue) -> Any:
    action, raw = value.action, value.raw.strip()
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if raw.lower() not in TRUE + FALSE:
            raise ValueError(f"{value.name}: is a switch; use one of {', '.join(TRUE)} or {', '.join(FALSE[:-1])}, "
                             f"got {raw!r}")
        on = raw.lower() in TRUE
        return on if isinstance(action, argparse._StoreTrueAction) else not on
    try:
        converted = raw if action.type is None else action.type(raw)  # type: ignore[operator]
    except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
        raise ValueError(f"{value.name}: {raw!r} is not a valid value for {action.option_strings[-1]}: {exc}") from None
    if action.choices is not None and converted not in action.choices:
        raise ValueError(f"{value.name}: must be one of {list(action.choices)}, got {raw!r}")
    return converted
