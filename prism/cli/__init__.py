"""cli."""

import argparse

EXIT_OOM = 3
"""Exit code when a rank ran out of memory (a device OOM or the job's memory cap); 1: another rank
failure; 2: bad input."""


def add_timeout_argument(parser, *, default_s: float, what: str = "the run", stall: bool = True) -> None:
    """``--timeout`` with its default in ``--help``, and what happens when it expires (``stall``:
    the launcher's hang watcher counts it from the last comm op any rank issued or completed)."""
    when = (f"seconds without progress (no rank issues or completes a comm op) before {what} is stopped"
            if stall else f"seconds before {what} is stopped")
    parser.add_argument(
        "--timeout", type=positive_seconds, default=default_s, metavar="SECONDS",
        help=f"{when} (default: %(default).0f), printing every rank's pending comm op. Ranks that disagree on "
             "an op (kind, group, seq, shapes, dtype), or a rank that finished while its peers wait for it, "
             "stop it at once")


def add_force_argument(parser) -> None:
    """``--force``: the run directory may hold a run of another program (``RunDir.claim``)."""
    parser.add_argument("--force", action="store_true",
                        help="replace the run in --out when it is another program's (its entrypoint, args, env, "
                             "world size, device or MoE router differ); without it such a directory is refused")


def _parsed(text: str, convert, what: str):
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = _parsed(text, int, "a whole number")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: an integer of at least 0."""
    value = _parsed(text, int, "a whole number")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a number of seconds above 0."""
    value = _parsed(text, float, "a number of seconds")
    if not value > 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value
