"""prism.core.host_speed: the probe that tells a report when its host's speed moved, and the line
the timing commands print from it."""

import torch
from rich.console import Console

from prism.cli.report import print_host_speed
from prism.core.host_speed import format_probes, parse_probes, probe_ms, spread


def test_the_probe_times_single_threaded_work_and_leaves_torchs_threads_as_they_were():
    threads = torch.get_num_threads()
    ms = probe_ms()
    assert 0.05 < ms < 5_000
    assert torch.get_num_threads() == threads


def test_spread_is_slowest_over_fastest():
    assert spread([5.0, 6.0, 5.5]) == 6.0 / 5.0 - 1
    assert spread([5.0]) == 0.0 and spread([]) == 0.0


def test_probes_survive_the_graph_meta_and_an_older_graph_has_none():
    assert parse_probes(format_probes([5.1234, 6.0])) == (5.123, 6.0)
    assert parse_probes("") == () and parse_probes("fast") == ()


def test_calibrate_warns_only_when_the_host_moved():
    steady, moved = Console(record=True, width=200), Console(record=True, width=200)
    print_host_speed([("across the slices", (5.0, 5.2, 5.1))], steady)
    print_host_speed([("across the slices", (5.0, 6.8, 5.1))], moved)
    assert "host speed: probe 5.00–5.20 ms across the slices (4 % apart)" in steady.export_text()
    assert "warning" not in steady.export_text()
    assert "warning: host speed: probe 5.00–6.80 ms across the slices (36 % apart)" in moved.export_text()
