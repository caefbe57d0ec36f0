"""``prism``: the command line. One thin module per command; all logic lives in the library."""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import signal
import sys
from collections.abc import Iterator

from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from prism.core.errors import PrismError, RankFailedError, RankOOMError

from . import (EXIT_OOM, analyze, calibrate, collect, demo, emulate, export, launcher, node, record, replay, simulate,
               slurm_task, validate, walk)

__all__ = ["main"]

class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread like SIGINT's KeyboardInterrupt, so that the
    same cleanup runs: every ``with Supervisor`` stops its processes, atomic writes roll back."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, _frame) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[None]:
    """SIGTERM/SIGHUP stop the command as SIGINT does (Python's default would exit at once:
    the workers would die with us, but no cleanup would run)."""
    previous = {sig: signal.signal(sig, _raise_interrupted) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

COMMANDS = {"record": record, "collect": collect, "simulate": simulate, "walk": walk, "export": export, "demo": demo,
            "emulate": emulate, "calibrate": calibrate, "validate": validate, "replay": replay,
            "analyze": analyze, "slurm-task": slurm_task, "node": node}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prism", description=__doc__)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        p = sub.add_parser(name, help=module.HELP, description=module.__doc__)
        module.add_arguments(p)
        if name in launcher.COMMANDS:
            launcher.add_arguments(p)
        p.set_defaults(handler=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(message)s", handlers=[RichHandler(show_path=False)])
    # Error lines are never wrapped by the console: in a pipe or a log (80 columns) a long path
    # split the message, and what a test or a grep looks for depended on the path's length.
    err = Console(stderr=True, soft_wrap=True)
    try:
        with _stop_on_signals():
            if getattr(args, "launcher", "local") == "slurm":
                return launcher.run(args, argv)
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
        err.print(f"[bold red]error:[/] {e.part} failed", highlight=False)
        err.print(e.traceback_text.rstrip(), markup=False, highlight=False)
        return 1
    except PrismError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}", markup=True, highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt as e:
        signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
        err.print(f"[bold red]interrupted:[/] prism {args.command} stopped by {signal.Signals(signum).name}; "
                  "every process of the run was stopped and no partial graph or payloads were written",
                  highlight=False)
        return 128 + signum  # as a shell reports it: 130 for Ctrl-C
    finally:
        # The interpreter's last collection walks every object torch created: seconds on a loaded
        # host between the run's end and the shell prompt. Nothing left needs collecting.
        gc.freeze()


if __name__ == "__main__":
    sys.exit(main())
