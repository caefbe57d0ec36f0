"""Progress bars shared by the commands."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["rank_progress"]


@contextlib.contextmanager
def rank_progress(description: str, total: int) -> Iterator[Callable[[int, int], None]]:
    """A bar of ranks finished; yields the callback ``(done, total)`` the launcher calls."""
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("ranks"),
        TimeElapsedColumn(), transient=False,
    ) as progress:
        task = progress.add_task(description, total=total)

        def update(done: int, total_: int) -> None:
            progress.update(task, completed=done, total=total_)

        yield update
