"""`chattts-velocity` command line: say | demo | demo-assets | export | serve | webui | bench."""
from chattts_velocity.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
