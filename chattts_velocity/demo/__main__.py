"""`python -m chattts_velocity.demo DIR [--tiny] [--seed N] [--force]`: write random demo weights."""
from __future__ import annotations

import argparse

from chattts_velocity.demo import check_demo_target, write_demo_assets


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write random ChatTTS weights in the official format.")
    parser.add_argument("dir", help="download root; files go to DIR/asset/...")
    parser.add_argument("--tiny", action="store_true", help="tiny test sizes instead of the official ones")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="write even into a folder holding other files")
    args = parser.parse_args(argv)
    try:
        check_demo_target(args.dir, args.force)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    print(f"demo assets written to {write_demo_assets(args.dir, seed=args.seed, tiny=args.tiny).root}")


if __name__ == "__main__":
    main()
