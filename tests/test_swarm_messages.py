"""Field validators: clean values out, ProtocolError naming the field otherwise."""

from __future__ import annotations

import pytest
import torch

from swarm.codec import Limits, encode_tensor
from swarm.errors import ProtocolError
from swarm.messages import (
    ERROR_CODES,
    error_message,
    require_bool,
    require_int,
    require_int_list,
    require_layers,
    require_map,
    require_str,
    require_tensor,
    require_type,
)


def bad(fn, *args, code: str = "bad_field", **kwargs) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        fn(*args, **kwargs)
    assert info.value.code == code
    return info.value


def test_ints_and_bools() -> None:
    msg = {"n": 5, "flag": True, "f": 1.0}
    assert require_int(msg, "n", min=1, max=5) == 5
    assert require_int(msg, "missing", default=3) == 3
    assert "'n'" in bad(require_int, msg, "n", max=4).message
    bad(require_int, msg, "flag")  # a bool is not an int on the wire
    bad(require_int, msg, "f")
    bad(require_int, msg, "missing")
    assert require_bool(msg, "flag") is True and require_bool(msg, "x", default=False) is False
    bad(require_bool, msg, "n")


def test_strings_lists_layers_maps() -> None:
    msg = {"s": "abc", "l": [0, 4], "rev": [4, 4], "m": {"a": 1}, "mixed": [1, "2"]}
    assert require_str(msg, "s") == "abc"
    bad(require_str, msg, "s", max_len=2)
    assert require_int_list(msg, "l", length=2) == [0, 4]
    bad(require_int_list, msg, "mixed")
    bad(require_int_list, msg, "l", length=3)
    assert require_layers(msg, "l", num_layers=4) == (0, 4)
    bad(require_layers, msg, "l", num_layers=3)
    bad(require_layers, msg, "rev")
    assert require_map(msg, "m") == {"a": 1} and require_map(msg, "x", optional=True) is None
    bad(require_map, msg, "s")


def test_tensor_and_type() -> None:
    msg = {
        "type": "step",
        "h": encode_tensor(torch.ones(2, 3)),
        "bad": {"dtype": "float32", "shape": [9], "data": b""},
    }
    assert require_tensor(msg, "h", Limits(), ndim=2).shape == (2, 3)
    bad(require_tensor, msg, "h", Limits(), ndim=3)
    bad(require_tensor, msg, "h", Limits(), dtypes=(torch.bfloat16,))
    assert "'bad'" in bad(require_tensor, msg, "bad", Limits(), code="bad_tensor").message
    bad(require_tensor, msg, "h", Limits(max_tensor_elements=5), code="too_large")
    assert require_type(msg) == "step"
    bad(require_type, {"type": "nope"}, code="unknown_type")


def test_error_message_retryable_default() -> None:
    assert error_message("busy", "full")["retryable"] is True
    assert error_message("bad_field", "x") == {
        "type": "error",
        "code": "bad_field",
        "message": "x",
        "retryable": False,
    }
    assert all(isinstance(v, bool) for v in ERROR_CODES.values())
