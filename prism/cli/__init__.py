"""cli."""

EXIT_OOM = 3
"""Exit code when a rank ran out of memory (a device OOM or the job's memory cap); 1: another rank
failure; 2: bad input."""
