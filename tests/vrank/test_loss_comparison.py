"""Losses compared as validate compares them: a step without a loss (NaN in memory, null once read
back from report.json) equals only another step without a loss."""

import math

from prism.vrank_replayer.fidelity import losses_bitwise_equal, losses_equal

NAN = math.nan


def test_no_loss_equals_no_loss_whether_nan_or_null():
    assert losses_bitwise_equal([NAN, 1.5], [None, 1.5])
    assert losses_bitwise_equal([None, 1.5], [NAN, 1.5])
    assert losses_equal([None, 1.5], [NAN, 1.5 * (1 + 1e-9)])


def test_a_loss_never_equals_a_missing_one_and_values_must_agree():
    assert not losses_bitwise_equal([None, 1.5], [1.0, 1.5])
    assert not losses_equal([1.0], [None])
    assert not losses_equal([1.0], [NAN])
    assert not losses_bitwise_equal([1.5], [1.5 + 1e-12])
    assert not losses_equal([1.5, 2.0], [1.5])
