"""The trace format: round trip and every malformed case rejected with a one-line error naming the field."""

import json
import math

import pytest

from dpcomm.errors import UserError
from dpcomm.trace import Layer, Trace, load_trace, save_trace


def _good() -> dict:
    return {
        "format": "dpcomm-trace/1",
        "model": "toy",
        "batch_size": 8,
        "device": "cpu",
        "dtype_bytes": 4,
        "layers": [
            {"name": "a", "params": 10, "forward_s": 0.001, "backward_s": 0.002, "flops": 5},
            {"name": "b", "params": 20, "forward_s": 0.003, "backward_s": 0.004},
        ],
    }


def test_round_trip_keeps_extra_fields(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps(_good()))
    t = load_trace(p)
    assert t.num_layers == 2 and t.total_params == 30
    assert math.isclose(t.t_f, 0.004) and math.isclose(t.t_b, 0.006)
    assert t.layers[0].extra == {"flops": 5}
    save_trace(t, tmp_path / "u.json")
    assert load_trace(tmp_path / "u.json") == t


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d.update(format="dpcomm-trace/0"), "format"),
        (lambda d: d.pop("model"), "model"),
        (lambda d: d.update(batch_size=0), "batch_size"),
        (lambda d: d.update(layers=[]), "layers"),
        (lambda d: d["layers"][1].pop("params"), "layers[1].params"),
        (lambda d: d["layers"][0].update(forward_s=-1.0), "layers[0].forward_s"),
        (lambda d: d["layers"][1].update(backward_s=float("nan")), "layers[1].backward_s"),
        (lambda d: d["layers"][1].update(params="many"), "layers[1].params"),
    ],
)
def test_malformed_trace_names_file_and_field(tmp_path, mutate, field):
    d = _good()
    mutate(d)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))  # NaN is written as the JSON extension NaN, which Python reads back
    with pytest.raises(UserError) as exc:
        load_trace(p)
    msg = str(exc.value)
    assert str(p) in msg and field in msg and "\n" not in msg


def test_bad_json_and_missing_file(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        load_trace(p)
    with pytest.raises(UserError, match="no such file"):
        load_trace(tmp_path / "missing.json")


def test_layer_validation():
    with pytest.raises(ValueError):
        Layer(name="x", params=1, forward_s=-1.0, backward_s=0.0)
    with pytest.raises(ValueError):
        Trace(model="m", batch_size=1, device="cpu", dtype_bytes=4, layers=())
