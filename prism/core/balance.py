"""MoE balance ratios (PrismLLM appendix F): fit a set of per-rank ratios to requested statistics,
turn them into a routing plan, and measure the ratios a run realised. Pure numpy.

A rank's balance ratio (br) in a gating call is the tokens its experts get over the even share
(all tokens of the EP group / ep). The mean over the group is 1 (tokens are conserved).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["br_stats", "fit_ratios", "shares", "token_matrix", "realised_ratios", "STAT_KEYS"]

STAT_KEYS = ("min", "max", "avg", "std", "med", "skew")


def br_stats(values) -> dict[str, float]:
    """min, max, avg, std (population), med, skew (population, Fisher) of ``values``."""
    x = np.asarray(values, dtype=np.float64)
    mean, std = float(x.mean()), float(x.std())
    skew = float(((x - mean) ** 3).mean() / std**3) if std > 0 else 0.0
    return {"min": float(x.min()), "max": float(x.max()), "avg": mean, "std": std,
            "med": float(np.median(x)), "skew": skew}


def _residual(x: np.ndarray, target: dict) -> np.ndarray:
    s = br_stats(x)
    return np.array([(s["med"] - target["med"]) / max(target["med"], 0.1),
                     (s["std"] - target["std"]) / max(target["std"], 0.05),
                     (s["skew"] - target["skew"]) / max(abs(target["skew"]), 0.5)])


def fit_ratios(target: dict, n: int, *, starts: int = 6, seed: int = 0) -> np.ndarray:
    """``n`` ratios, sorted, whose min and max are the requested ones and whose mean (1), median,
    std and skew come as close to ``target`` as a damped Gauss-Newton over the interior values
    gets (``n`` ≥ 4 for all six; fewer values match what they can)."""
    lo, hi, med = target["min"], target["max"], target["med"]
    if n == 1:
        return np.array([1.0])
    half = n // 2
    x = np.concatenate([np.linspace(lo, med, half, endpoint=False), np.linspace(med, hi, n - half)])
    x = _mean_one(x, lo, hi)
    if n < 4:
        return x
    rng = np.random.default_rng(seed)
    best = _descend(x, target)
    for _ in range(starts - 1):
        if float(np.abs(_residual(best, target)).max()) < 1e-4:
            break
        inner = np.sort(rng.uniform(lo, hi, n - 2))
        x = _descend(_mean_one(np.concatenate([[lo], inner, [hi]]), lo, hi), target)
        if np.linalg.norm(_residual(x, target)) < np.linalg.norm(_residual(best, target)):
            best = x
    return best


def _descend(x: np.ndarray, target: dict, iterations: int = 200) -> np.ndarray:
    """Damped Gauss-Newton on the interior values of ``x`` (its ends are the min and the max)."""
    lo, hi, n = x[0], x[-1], len(x)
    damping = 1e-3
    for _ in range(iterations):
        r = _residual(x, target)
        if float(np.abs(r).max()) < 1e-6:
            break
        jac = np.zeros((len(r), n - 2))
        for j in range(1, n - 1):
            dx = x.copy()
            dx[j] += 1e-6
            jac[:, j - 1] = (_residual(np.sort(dx), target) - r) / 1e-6
        step = np.linalg.solve(jac.T @ jac + damping * np.eye(n - 2), -jac.T @ r)
        trial = x.copy()
        trial[1:-1] = trial[1:-1] + step
        trial = _mean_one(trial, lo, hi)
        if np.linalg.norm(_residual(trial, target)) < np.linalg.norm(r):
            x, damping = trial, max(damping / 3, 1e-9)
        else:
            damping *= 5
            if damping > 1e6:  # no step helps: a local minimum
                break
    return x


def _mean_one(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """``x`` sorted with its interior shifted (within [lo, hi]) so that the mean is 1."""
    x = x.copy()
    for _ in range(50):
        x[1:-1] = np.clip(x[1:-1] + (len(x) - x.sum()) / (len(x) - 2), lo, hi)
        if abs(x.sum() - len(x)) < 1e-12:
            break
    return np.sort(x)


def shares(ratios: np.ndarray, tokens_per_rank: int) -> list[int]:
    """Tokens each of the ep ranks gets in one gating call: ratio × tokens_per_rank, rounded so
    the group's total (ep × tokens_per_rank) is kept (largest remainders)."""
    ep = len(ratios)
    total = ep * tokens_per_rank
    raw = np.asarray(ratios, dtype=np.float64) * total / float(np.sum(ratios))
    out = np.floor(raw).astype(int)
    for i in np.argsort(-(raw - out))[: total - int(out.sum())]:
        out[i] += 1
    return [int(v) for v in out]


def token_matrix(per_dest: list[int], tokens_per_rank: int) -> list[list[int]]:
    """``m[s][r]``: tokens source rank s sends to rank r, every source sending ``tokens_per_rank``
    and rank r receiving ``per_dest[r]`` in all (the north-west corner rule)."""
    ep = len(per_dest)
    m = [[0] * ep for _ in range(ep)]
    need = list(per_dest)
    r = 0
    for s in range(ep):
        left = tokens_per_rank
        while left and r < ep:
            take = min(left, need[r])
            m[s][r] += take
            left -= take
            need[r] -= take
            if need[r] == 0:
                r += 1
    return m


def realised_ratios(sent: dict[int, list[int]]) -> list[float]:
    """The ratios of one gating call of an EP group from what each of its ranks sent to each
    (``sent[source] = [tokens to rank 0, ...]``, group-rank order)."""
    received = np.sum(np.array([sent[s] for s in sorted(sent)], dtype=np.float64), axis=0)
    even = received.sum() / len(received)
    return [float(v / even) if even > 0 else math.nan for v in received]


def router_summary(logs: list[dict]) -> dict:
    """Realised balance ratios from the MoE mock router's per-rank logs (``rank-R.moe_router.json``
    contents, every rank of each EP group present): per EP group and step, each rank's ratio (its
    mean over the step's gating calls) and the statistics over all (call, rank) ratios of the
    step, beside the requested ones."""
    groups: dict[int, dict[int, dict]] = {}
    for d in logs:
        groups.setdefault(d["group"], {})[d["group_rank"]] = d
    out: dict = {"groups": {}}
    for g, by_rank in sorted(groups.items()):
        ep = next(iter(by_rank.values()))["ep"]
        out["target"] = next(iter(by_rank.values()))["target"]
        if sorted(by_rank) != list(range(ep)):
            out["groups"][str(g)] = {"missing_ranks": sorted(set(range(ep)) - set(by_rank))}
            continue
        calls = min(len(d["calls"]) for d in by_rank.values())
        steps: dict[int, dict] = {}
        for c in range(calls):
            ratios = realised_ratios({gr: by_rank[gr]["calls"][c]["sent"] for gr in range(ep)})
            step = by_rank[0]["calls"][c]["step"]
            s = steps.setdefault(step, {"values": [], "per_rank": {gr: [] for gr in range(ep)}})
            s["values"].extend(ratios)
            for gr, v in enumerate(ratios):
                s["per_rank"][gr].append(v)
        out["groups"][str(g)] = {
            str(step): {"stats": br_stats(s["values"]),
                        "br": {str(by_rank[gr]["rank"]): float(np.mean(v)) for gr, v in s["per_rank"].items()}}
            for step, s in sorted(steps.items())}
    return out
