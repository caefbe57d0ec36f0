# Scratch probes for a sandbox rank's process (session 23, activation offload's emulated compute on
# 16 cores), switched by environment variables; put this folder first on PYTHONPATH:
#   PROBE_SWITCH_INTERVAL=S   sys.setswitchinterval(S) (CPython's default is 0.005 s)
#   PROBE_PRELOAD_OFF=1       the live engine's recorded-data store loads nothing ahead
#   PROBE_THREADS=DIR         every 0.5 s, DIR/threads-<pid>.txt: each thread's CPU seconds by name
#   PROBE_PACK=DIR            every second, DIR/pack-<pid>.json: each saved-tensor pack/unpack hook call's time
#   PROBE_GC=DIR              every second, DIR/gc-<pid>.json: each collection's generation and time, objects tracked
import os
import sys

if os.environ.get("PROBE_SWITCH_INTERVAL"):
    sys.setswitchinterval(float(os.environ["PROBE_SWITCH_INTERVAL"]))

if os.environ.get("PROBE_PRELOAD_OFF") == "1":
    import functools

    from prism.nccl_patches import recorded_store

    recorded_store.RecordedStore.__init__ = functools.partialmethod(recorded_store.RecordedStore.__init__,
                                                                    preload_bytes=0)

if os.environ.get("PROBE_THREADS"):
    import threading
    import time

    def _dump(directory: str) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        while True:
            time.sleep(0.5)
            rows = []
            python_names = {t.native_id: t.name for t in threading.enumerate()}  # the OS name is "python3"
            for tid in os.listdir("/proc/self/task"):
                try:
                    name = python_names.get(int(tid)) or open(f"/proc/self/task/{tid}/comm").read().strip()
                    name = name.replace(" ", "_")
                    fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                rows.append(f"{name} {tid} {(int(fields[11]) + int(fields[12])) / tick:.2f}")
            with open(os.path.join(directory, f"threads-{os.getpid()}.txt"), "w") as f:
                f.write(" ".join(sys.argv)[:160] + "\n" + "\n".join(sorted(rows)) + "\n")

    threading.Thread(target=_dump, args=(os.environ["PROBE_THREADS"],), daemon=True, name="probe").start()

if os.environ.get("PROBE_SLEEP"):
    # Every time.sleep of >= 5 ms (the job's sleep compute): its start, the time asked and the time it
    # took, written every second to DIR/sleep-<pid>.json (workers leave through os._exit, no atexit). The oversleep is the wake-up (and the GIL's
    # return); the gaps between one sleep's end and the next one's start are the rank's own work.
    import json
    import threading
    import time

    _sleep, _clock, _calls = time.sleep, time.perf_counter, []

    def _timed_sleep(seconds):
        if seconds < 0.005:
            return _sleep(seconds)
        start = _clock()
        _sleep(seconds)
        _calls.append((start, seconds, _clock() - start))

    def _write(directory: str) -> None:
        while True:
            _sleep(1.0)
            if _calls:
                with open(os.path.join(directory, f"sleep-{os.getpid()}.json"), "w") as f:
                    json.dump({"argv": " ".join(sys.argv)[:160], "calls": list(_calls)}, f)

    time.sleep = _timed_sleep
    threading.Thread(target=_write, args=(os.environ["PROBE_SLEEP"],), daemon=True, name="probe-sleep").start()

if os.environ.get("PROBE_PACK"):
    # Every saved-tensor pack and unpack hook (activation offload's host copies): the time each call
    # took and its bytes, and the process's page faults, context switches and CPU from its 100th pack
    # on (past start-up), written every second to DIR/pack-<pid>.json.
    import json
    import resource
    import threading
    import time

    import torch.autograd.graph as _graph

    _pack_calls: dict[str, list] = {"pack": [], "unpack": []}
    _usage: dict[str, dict] = {}

    def _thread_faults() -> dict[str, int]:
        names = {t.native_id: t.name for t in threading.enumerate()}
        faults = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
                name = names.get(int(tid)) or open(f"/proc/self/task/{tid}/comm").read().strip()
            except OSError:
                continue
            faults[f"{name}:{tid}"] = int(fields[7])  # minflt
        return faults

    import ctypes

    class _Mallinfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    _libc = ctypes.CDLL(None)
    _libc.mallinfo2.restype = _Mallinfo2

    def _mallinfo() -> dict:
        """glibc's heap now: ``arena`` (bytes of heap), ``hblks``/``hblkhd`` (chunks and bytes
        served by mmap), ``fordblks`` (free heap bytes). Large blocks live in mmapped chunks while
        they are above glibc's dynamic mmap threshold, on the heap once a larger freed chunk has
        raised it."""
        info = _libc.mallinfo2()
        return {name: int(getattr(info, name)) for name, _ in _Mallinfo2._fields_}

    def _usage_now() -> dict:
        use = resource.getrusage(resource.RUSAGE_SELF)
        return {"minflt": use.ru_minflt, "nvcsw": use.ru_nvcsw, "nivcsw": use.ru_nivcsw, "utime": use.ru_utime,
                "stime": use.ru_stime, "threads": threading.active_count(), "at": time.perf_counter(),
                "packs": len(_pack_calls["pack"]), "thread_faults": _thread_faults(), "mallinfo": _mallinfo()}

    def _timed(what, fn):
        def hook(x):
            start = time.perf_counter()
            out = fn(x)
            _pack_calls[what].append((time.perf_counter() - start, getattr(x, "nbytes", 0)))
            if what == "pack" and len(_pack_calls["pack"]) == 100:  # past start-up and the first steps
                _usage["from"] = _usage_now()
            elif what == "pack" and len(_pack_calls["pack"]) > 100 and len(_pack_calls["pack"]) % 10 == 0:
                m = _mallinfo()  # mid-forward: how the live activations are held
                peaks = _usage.setdefault("heap_peaks", {"hblks": 0, "hblkhd": 0, "arena": 0})
                for k in peaks:
                    peaks[k] = max(peaks[k], m[k])
            return out
        return hook

    class _TimedHooks(_graph.saved_tensors_hooks):
        def __init__(self, pack_hook, unpack_hook):
            super().__init__(_timed("pack", pack_hook), _timed("unpack", unpack_hook))

    def _write_packs(directory: str) -> None:
        while True:
            time.sleep(1.0)
            path = os.path.join(directory, f"pack-{os.getpid()}.json")
            if "from" in _usage:
                _usage["to"] = _usage_now()
            with open(path + ".tmp", "w") as f:  # whole files only: the process may die mid-write
                json.dump({"argv": " ".join(sys.argv)[:160], "rank": os.environ.get("RANK"), "usage": _usage,
                           **_pack_calls}, f)
            os.replace(path + ".tmp", path)

    _graph.saved_tensors_hooks = _TimedHooks
    threading.Thread(target=_write_packs, args=(os.environ["PROBE_PACK"],), daemon=True, name="probe-pack").start()

if os.environ.get("PROBE_GC"):
    # Every garbage collection's generation and time, and the objects the collector tracks, written
    # every second to DIR/gc-<pid>.json.
    import gc
    import json
    import threading
    import time

    _gc_calls: list = []
    _gc_start = [0.0]

    def _on_gc(phase, info):
        if phase == "start":
            _gc_start[0] = time.perf_counter()
        else:
            _gc_calls.append((info["generation"], time.perf_counter() - _gc_start[0], info["collected"]))

    def _write_gc(directory: str) -> None:
        while True:
            time.sleep(1.0)
            path = os.path.join(directory, f"gc-{os.getpid()}.json")
            with open(path + ".tmp", "w") as f:
                json.dump({"argv": " ".join(sys.argv)[:160], "rank": os.environ.get("RANK"),
                           "tracked": len(gc.get_objects()), "counts": gc.get_count(), "calls": _gc_calls}, f)
            os.replace(path + ".tmp", path)

    gc.callbacks.append(_on_gc)
    threading.Thread(target=_write_gc, args=(os.environ["PROBE_GC"],), daemon=True, name="probe-gc").start()
