"""Candidate merges of calibration takes against prism's two, offline, on kept run directories
(``bench/emulate_fidelity.py --keep``), each calibrated prediction against the median of the further
real runs (as ``recalibrate.py``), ranks 2 and 5, 5 measured steps after 2 warm-up; then the mean and
the largest |error| of each merge over every directory given.

* ``median``, ``rotated``: prism's (``prism calibrate --merge``; ``rotated`` over each slice's
  typical takes, ``merge_slice``, since session 43);
* ``rotated-every-take``: the rotation over every take (prism's ``rotated`` in sessions 40–42);
* ``med-step``: per rank, each measured step from the take whose step (its nodes' summed durations)
  is the median of the takes' at that step: a real step, never an outlier take's;
* ``med-step-slice``: the same choice per slice of 4 ranks (the slice's summed step), so the ranks
  measured together stay together.

    python bench/_debug/merge_candidates.py RUN [RUN ...]
"""
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _calibration_takes import CalibrationTakes
from prism.calibration import merge_takes
from prism.calibration.merge import _same_program
from recalibrate import real_steps_ms

def step_totals(nodes):
    tot = {}
    for n in nodes:
        tot[n.step] = tot.get(n.step, 0) + max(n.duration_ns, 0)
    return tot

def median_step(takes, skip):
    same = _same_program(takes)
    tots = [step_totals(t) for t in same]
    choice = {}
    for s in tots[0]:
        if s < skip: continue
        order = sorted(range(len(same)), key=lambda k: tots[k].get(s, 0))
        choice[s] = order[(len(order) - 1) // 2]
    return tuple(dataclasses.replace(n, duration_ns=same[choice[n.step]][i].duration_ns) if n.step in choice else n
                 for i, n in enumerate(same[0]))

def median_step_coherent(ct, skip):
    """per slice: choose per step the take whose slice-total (sum over the slice's ranks) is the median."""
    # slices: ranks grouped by identical take count & ... approximate: use rank // slice size 4
    groups = {}
    for r in ct.takes: groups.setdefault(r // 4, []).append(r)
    measured = {}
    for g, ranks in groups.items():
        k = min(len(ct.takes[r]) for r in ranks)
        tots = [ {} for _ in range(k)]
        for r in ranks:
            for kk in range(k):
                for s, v in step_totals(ct.takes[r][kk]).items():
                    tots[kk][s] = tots[kk].get(s, 0) + v
        choice = {}
        for s in tots[0]:
            if s < skip: continue
            order = sorted(range(k), key=lambda kk: tots[kk].get(s, 0))
            choice[s] = order[(k - 1) // 2]
        for r in ranks:
            t = ct.takes[r]
            measured[r] = tuple(dataclasses.replace(n, duration_ns=t[choice[n.step]][i].duration_ns) if n.step in choice else n for i, n in enumerate(t[0]))
    return measured

skip, nsteps = 2, 5
tot = {}
for run in sys.argv[1:]:
    run = Path(run)
    ct = CalibrationTakes(run, skip)
    truth = {r: real_steps_ms(run, r) for r in (2, 5)}
    rows = {
        "median": ct.prediction_steps_ms("median"),
        "rotated": ct.prediction_steps_ms("rotated"),
        "rotated-every-take": ct.steps_ms({r: merge_takes(ts, skip, "rotated") for r, ts in ct.takes.items()}),
        "med-step": ct.steps_ms({r: median_step(ts, skip) for r, ts in ct.takes.items()}),
        "med-step-slice": ct.steps_ms(median_step_coherent(ct, skip)),
    }
    out = [f"{run.parent.parent.parent.name[-6:]}/{run.name[:18]:18s}"]
    for name, steps in rows.items():
        errs = []
        for r in (2, 5):
            w = range(skip, min(skip + nsteps, len(steps[r]), len(truth[r])))
            c, t = (statistics.fmean(x[s] for s in w) for x in (steps[r], truth[r]))
            errs.append((c / t - 1) * 100)
        tot.setdefault(name, []).extend(abs(e) for e in errs)
        out.append(f"{name} {errs[0]:+.2f}/{errs[1]:+.2f}")
    print("  ".join(out))
print({k: round(statistics.fmean(v), 2) for k, v in tot.items()}, {k: round(max(v), 2) for k, v in tot.items()})
