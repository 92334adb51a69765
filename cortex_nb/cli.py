"""The `cortex-nb` command: `demo`, and `backend serve|token` for the GPU host."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cortex-nb", description="Fine-tune and sample language models from notebooks.")
    from .version import __version__

    parser.add_argument("--version", action="version", version=f"cortex-nb {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="fine-tune the built-in tiny model on the embedded backend")
    demo.add_argument("--steps", type=int, default=200)
    demo.add_argument("--lr", type=float, default=3e-3)
    demo.add_argument("--data-dir", default=None, help="the embedded backend's data dir (default: ~/.local/share/cortex-nb/local)")
    backend = commands.add_parser("backend", help="run or administer the backend service (needs cortex-nb[backend])")
    try:
        from cortex_backend.cli import add_backend_commands
    except ImportError:  # the kernel-side install has no backend
        backend.set_defaults(backend_missing=True)
    else:
        add_backend_commands(backend)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        from .demo import run_demo

        run_demo(steps=args.steps, learning_rate=args.lr, data_dir=args.data_dir)
        return
    if args.command == "backend":
        if getattr(args, "backend_missing", False):
            print("error: the backend is not installed here; pip install 'cortex-nb[backend]'", file=sys.stderr)
            sys.exit(2)
        from cortex_backend.cli import run_backend_command

        sys.exit(run_backend_command(args))


if __name__ == "__main__":
    main()
