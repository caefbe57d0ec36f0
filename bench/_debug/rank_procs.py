"""The pids of a run's rank processes: prism sandbox workers or plain ``train.py`` ranks (shared by
the per-process samplers in this folder)."""
import os


def rank_pids() -> list[str]:
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cl = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except Exception:
            continue
        if ("prism.sandbox.worker" not in cl and "train.py" not in cl) or "sh -c" in cl or "launch_plain" in cl:
            continue
        pids.append(pid)
    return pids
