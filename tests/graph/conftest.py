from __future__ import annotations

from pathlib import Path

import pytest

from prism.graph import Graph, parse_graph

ASSETS = Path(__file__).resolve().parent.parent / "assets" / "graphs"


def load_asset(name: str) -> Graph:
    return parse_graph((ASSETS / f"{name}.txt").read_text(encoding="utf-8"))


@pytest.fixture
def two_rank_all_reduce() -> Graph:
    return load_asset("two_rank_all_reduce")


@pytest.fixture
def pipeline_2stage() -> Graph:
    return load_asset("pipeline_2stage")
