"""`prism validate` on the tiny real models (issue #5's model acceptance), one command for the table.

For each example (hybrid, pp, moe, fsdp2 at W=8; sandbox ranks 0 and 5 by default) this runs
``prism validate``: the real job (all 8 ranks, gloo, ``prism record``), the capture run and the
calibration slices, the emulation of the sandbox ranks with every other rank virtual, and the same
ranks alone under PyTorch's fake process group. Per sandbox rank it reports the comm signature
match against the real run, whether the losses equal the capture run's (the run whose comm values
are the recorded ones) bit for bit and the real run's within 1e-5, the peak tracked memory
against the real run's (and the spread of that peak over ``--real-repeats`` real runs: which comm
buffers are still in flight at a rank's peak depends on timing), the ops that diverged, and what
the fake process group gave. A rank meets the acceptance when its signature matches 100 %, its
losses equal the collected ones bitwise, no op diverged, and both its emulated peaks (measured
steps, whole run) lie in the spread of the real runs (``prism validate --real-repeats``).

    python bench/validate_models.py                          # hybrid, pp, moe, fsdp2; ranks 0,5
    python bench/validate_models.py --models pp --ranks 2,7

JSON goes to ``--out`` (default bench/results/validate_models.json).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prism.cli.validate import validate

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench.validate_models")


def _peak(c: dict) -> str:
    real = f"{c['real_min_bytes']:,}" + (f"–{c['real_max_bytes']:,}" if c["timing_dependent"] else "")
    verdict = "=" if c["equal"] else "in spread" if c["in_real_spread"] else "OUT"
    return f"{c['emulated_bytes']:,} / {real} ({verdict})"


def _row(name: str, rank: int, v: dict) -> list[str]:
    p, f = v["prism"], v["torch_fake"]
    if f is None:
        fake = "—"
    elif f["status"] == "crashed":
        fake = f"crashed: {f['error'][:50]}"
    else:
        fake = (f"signature {f['signature_match'] * 100:.0f} %, losses {'equal' if f['losses_equal'] else 'wrong'}, "
                f"peak {f['peak_memory_bytes'] - p['real_peak_memory_bytes']:+,} B")
    return [name, str(rank), f"{p['signature_match'] * 100:.1f} %", "yes" if p["losses_bitwise_collected"] else "no",
            "yes" if p["losses_equal"] else f"no ({p['max_loss_rel_diff']:.1e})",
            _peak(p["peaks"]["measured"]), _peak(p["peaks"]["run"]), str(p["diverged_ops"]), fake]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="hybrid,pp,moe,fsdp2")
    p.add_argument("--ranks", default="0,5")
    p.add_argument("--real-repeats", type=int, default=3,
                   help="real runs per job: the peak of a rank can depend on which comm buffers are in flight")
    p.add_argument("--keep", default=None, help="directory for the run directories (default: a temporary one)")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "validate_models.json"))
    ns = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    results = []
    with tempfile.TemporaryDirectory(prefix="prism-validate-models-") as tmp:
        root = Path(ns.keep or tmp)
        for name in ns.models.split(","):
            t0 = time.time()
            res = validate(str(ROOT / "examples" / name / "job.yaml"), ns.ranks, str(root / name), slice_size=2,
                           timeout_s=ns.timeout, torch_fake=True, real_repeats=ns.real_repeats)
            res["wall_s"] = time.time() - t0
            log.warning("%s: validated in %.0f s", name, res["wall_s"])
            results.append(res)
    table = Table(title=f"prism validate, W=8, sandbox ranks {ns.ranks}: emulation vs the real run", title_justify="left")
    for col in ("job", "rank", "comm signature", "losses = collected (bitwise)", "losses = real (1e-5)",
                f"peak B, measured steps: emulated / {ns.real_repeats} real runs",
                f"peak B, whole run: emulated / {ns.real_repeats} real runs", "diverged ops",
                "torch fake PG, same rank alone"):
        table.add_column(col)
    met = True
    for res in results:
        for r, v in res["ranks"].items():
            table.add_row(*_row(res["job"], int(r), v))
            pr = v["prism"]
            met &= (pr["signature_match"] == 1.0 and pr["losses_bitwise_collected"]
                    and pr["peak_in_real_spread"] and pr["diverged_ops"] == 0)
    Console(width=200).print(table)
    out = {"benchmark": "validate_models", "ranks": ns.ranks, "models": results, "met": met}
    Path(ns.out).write_text(json.dumps(out, indent=1, default=str))
    print(f"{ns.out}: {'every figure met' if met else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
