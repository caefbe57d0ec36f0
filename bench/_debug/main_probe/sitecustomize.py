"""A probe of the script's main thread, the same in a plain launch and under ``prism record``
(bench/_debug/record_profile.sh), loaded by every Python process that has this folder on
PYTHONPATH:

* ``PRISM_GC_OUT=DIR``: log every cyclic garbage collection (start, generation, thread CPU,
  objects collected) and every ``optimizer.step`` end to ``DIR/gc-<pid>-<pass>.json`` at exit;
* ``PRISM_STEP_PROFILE=DIR``: cProfile (wall clock) of the thread that runs ``optimizer.step`` (on Python
  3.12+ of every thread: cProfile is process-wide there, prism/core/cprofile.py), from
  the end of the 3rd step on, into ``DIR/main-<pid>-<pass>.prof`` at exit, with the number of
  steps profiled in ``DIR/main-<pid>-<pass>.steps``.

``<pass>`` is ``PRISM_RECORD_PASS`` (``memory`` or ``timed`` under a two-pass ``prism record``),
else ``run``. Both are written at exit, ``os._exit`` included (a record worker ends with it)."""

import os

_GC = os.environ.get("PRISM_GC_OUT")
_PROF = os.environ.get("PRISM_STEP_PROFILE")
if _GC or _PROF:
    import atexit
    import gc
    import json
    import sys
    import time

    from torch.optim.optimizer import register_optimizer_step_post_hook  # both sides alike

    _events: list = []  # (perf_counter at start, generation, thread CPU s, collected)
    _steps: list = []
    _start = [0.0, 0.0]
    _prof = [None]

    def _step_end(*_a) -> None:
        _steps.append(time.perf_counter())
        if _PROF and len(_steps) == 3:
            import cProfile

            _prof[0] = cProfile.Profile()
            _prof[0].enable()

    def _cb(phase, info):
        if phase == "start":
            _start[0], _start[1] = time.perf_counter(), time.thread_time()
            return
        _events.append((_start[0], info["generation"], time.thread_time() - _start[1], info.get("collected", 0)))

    register_optimizer_step_post_hook(_step_end)
    if _GC:
        gc.callbacks.append(_cb)

    def _dump():
        _tag = f"{os.getpid()}-{os.environ.get('PRISM_RECORD_PASS', 'run')}"  # set after start-up
        if _GC:
            os.makedirs(_GC, exist_ok=True)
            with open(os.path.join(_GC, f"gc-{_tag}.json"), "w") as f:
                json.dump({"argv": sys.argv[:3], "events": _events, "steps": _steps}, f)
        if _prof[0] is not None:
            _prof[0].disable()
            os.makedirs(_PROF, exist_ok=True)
            _prof[0].dump_stats(os.path.join(_PROF, f"main-{_tag}.prof"))
            with open(os.path.join(_PROF, f"main-{_tag}.steps"), "w") as f:
                f.write(str(len(_steps) - 3))

    atexit.register(_dump)
    _exit = os._exit

    def _dump_then_exit(code):
        try:
            _dump()
        finally:
            _exit(code)

    os._exit = _dump_then_exit
