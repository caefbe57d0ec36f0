"""The JSON prism writes for users is standard JSON: an unmeasured figure is null, not NaN."""

import json

import pytest

from prism.core.strict_json import dumps_strict


def refuse(constant):
    raise ValueError(f"not JSON: {constant}")


def test_nan_and_infinities_become_null_at_any_depth_and_the_rest_is_kept():
    text = dumps_strict({"losses": [float("nan"), 1.5], "rows": ({"error": float("inf")}, {"error": -0.25}),
                         "n": 3, "name": "x", "ok": True, "none": None})
    data = json.loads(text, parse_constant=refuse)
    assert data == {"losses": [None, 1.5], "rows": [{"error": None}, {"error": -0.25}], "n": 3, "name": "x",
                    "ok": True, "none": None}


def test_python_s_own_dump_would_not_be_json():
    with pytest.raises(ValueError, match="not JSON: NaN"):
        json.loads(json.dumps([float("nan")]), parse_constant=refuse)
