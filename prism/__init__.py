"""prism: study a large distributed PyTorch training job with a handful of devices.

Scripts never need to import prism. The two optional calls below let a script state its
iteration boundaries and loss explicitly; outside a prism sandbox they do nothing.
"""

from __future__ import annotations

__all__ = ["mark_step", "report", "__version__"]

__version__ = "0.1.0"


def _recorder():
    import sys

    shim = sys.modules.get("prism.sandbox.shim")
    sandbox = shim.current_sandbox() if shim is not None else None
    return sandbox.recorder if sandbox is not None else None


def mark_step() -> None:
    """End the current iteration (for scripts that do not step a torch optimizer once per step)."""
    recorder = _recorder()
    if recorder is not None:
        recorder.mark_step()


def report(*, loss=None) -> None:
    """Report this step's loss (a float or a 0-dim tensor), overriding the automatic capture."""
    recorder = _recorder()
    if recorder is not None:
        recorder.report(loss=loss)
