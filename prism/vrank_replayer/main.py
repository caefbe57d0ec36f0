"""``python -m prism.vrank_replayer.main --spec SPEC.json``: one replayer process (kept apart from
the package's imports so runpy executes it once)."""

from __future__ import annotations

import os
import sys

from .replayer import main

if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # gloo threads must not hold up the exit
