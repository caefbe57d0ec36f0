"""``prism``: the command line. One thin module per command; all logic lives in the library."""

from __future__ import annotations

import argparse
import logging
import sys

from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from prism.core.errors import PrismError, RankFailedError, RankOOMError

from . import EXIT_OOM, calibrate, collect, demo, emulate, export, record, simulate, validate, walk

__all__ = ["main"]

COMMANDS = {"record": record, "collect": collect, "simulate": simulate, "walk": walk, "export": export, "demo": demo,
            "emulate": emulate, "calibrate": calibrate, "validate": validate}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prism", description=__doc__)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        p = sub.add_parser(name, help=module.HELP, description=module.__doc__)
        module.add_arguments(p)
        p.set_defaults(handler=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(message)s", handlers=[RichHandler(show_path=False)])
    # Error lines are never wrapped by the console: in a pipe or a log (80 columns) a long path
    # split the message, and what a test or a grep looks for depended on the path's length.
    err = Console(stderr=True, soft_wrap=True)
    try:
        return int(args.handler(args) or 0)
    except RankOOMError as e:
        for o in e.ooms:
            asked = f"tried to allocate {o.requested_bytes} B" if o.requested_bytes >= 0 else "allocation failed"
            cap = f"cap {o.cap_bytes} B" if o.cap_bytes else "no cap"
            err.print(f"[bold red]error:[/] rank {o.rank} ran out of memory at step {o.step}: {asked}, "
                      f"{o.in_use_bytes} B in use, {cap}", highlight=False)
        err.print(e.traceback_text.rstrip(), markup=False, highlight=False)
        return EXIT_OOM
    except RankFailedError as e:
        err.print(f"[bold red]error:[/] rank {e.rank} failed")
        err.print(e.traceback_text.rstrip(), markup=False, highlight=False)
        return 1
    except PrismError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}", markup=True, highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
