"""Codec: tensor/message round trips and hostile input that must fail cleanly and cheaply."""

from __future__ import annotations

import time
import tracemalloc

import msgpack
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarm.codec import (
    DTYPES,
    Limits,
    all_finite,
    decode_message,
    decode_tensor,
    encode_message,
    encode_tensor,
)
from swarm.errors import ProtocolError

LIMITS = Limits()
SMALL = Limits(max_frame_bytes=1 << 16, max_tensor_elements=1000)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32])
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 5), (2, 0, 3), (1, 2, 3, 4)])
def test_tensor_round_trip_all_dtypes(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    t = (torch.randn(shape) * 1000).to(dtype)
    payload = encode_message({"type": "x", "t": encode_tensor(t)})
    out = decode_tensor(decode_message(payload, LIMITS)["t"], LIMITS)
    assert out.dtype == dtype and out.shape == t.shape
    assert torch.equal(out, t)
    out.add_(1)  # writable, and owns its memory
    assert torch.equal(decode_tensor(decode_message(payload, LIMITS)["t"], LIMITS), t)


def test_bfloat16_bits_exact_and_non_contiguous_input() -> None:
    bits = torch.arange(-32768, 32767, 97, dtype=torch.int32).to(torch.int16)
    t = bits.view(torch.bfloat16)
    out = decode_tensor(encode_tensor(t), LIMITS)
    assert torch.equal(out.view(torch.int16), bits)  # NaN payloads included
    base = torch.randn(4, 6)
    assert torch.equal(decode_tensor(encode_tensor(base.t()[1:, ::2]), LIMITS), base.t()[1:, ::2])


def test_encode_refuses_unsupported() -> None:
    with pytest.raises(TypeError):
        encode_tensor(torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError):
        encode_tensor(torch.zeros(1, 1, 1, 1, 1))
    with pytest.raises(TypeError):
        encode_message({"no": "type"})


@pytest.mark.parametrize(
    "obj, code",
    [
        ("not a map", "bad_tensor"),
        ({"dtype": "float64", "shape": [1], "data": b"\0" * 8}, "bad_tensor"),
        ({"dtype": "float32", "shape": [-1], "data": b""}, "bad_tensor"),
        ({"dtype": "float32", "shape": [True], "data": b"\0" * 4}, "bad_tensor"),
        ({"dtype": "float32", "shape": [1.0], "data": b"\0" * 4}, "bad_tensor"),
        ({"dtype": "float32", "shape": [1, 1, 1, 1, 1], "data": b"\0" * 4}, "bad_tensor"),
        ({"dtype": "float32", "shape": "1", "data": b"\0" * 4}, "bad_tensor"),
        ({"dtype": "float32", "shape": [2], "data": b"\0" * 4}, "bad_tensor"),
        ({"dtype": "float32", "shape": [1], "data": "abcd"}, "bad_tensor"),
        ({"dtype": "bfloat16", "shape": [3], "data": b"\0" * 5}, "bad_tensor"),
        ({"dtype": "float32", "shape": [2**40, 2**40], "data": b""}, "too_large"),
        ({"dtype": "float32", "shape": [1001], "data": b"\0" * 4004}, "too_large"),
    ],
)
def test_decode_tensor_rejects(obj: object, code: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_tensor(obj, SMALL)
    assert info.value.code == code
    assert info.value.to_message()["type"] == "error"


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",  # never-used msgpack byte
        msgpack.packb([1, 2, 3]),
        msgpack.packb({"no_type": 1}),
        msgpack.packb({"type": 5}),
        msgpack.packb({1: "int key", "type": "x"}),
        msgpack.packb({"type": "x"}) + b"\x00",  # trailing bytes
        msgpack.packb({"type": "x", "e": msgpack.ExtType(5, b"abc")}),
        b"\xdb\xff\xff\xff\xff",  # str32 declaring 4 GiB
        b"\xc6\xff\xff\xff\xff",  # bin32 declaring 4 GiB
        b"\xdd\xff\xff\xff\xff",  # array32 declaring 4G entries
        b"\xdf\xff\xff\xff\xff",  # map32 declaring 4G entries
        b"\x91" * 100_000,  # deeply nested arrays
    ],
)
def test_decode_message_rejects_without_big_allocations(payload: bytes) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError) as info:
            decode_message(payload, LIMITS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.code == "bad_message"
    assert peak < 4 * len(payload) + (1 << 20), f"decoding allocated {peak} bytes"


def test_payload_above_limit() -> None:
    with pytest.raises(ProtocolError) as info:
        decode_message(encode_message({"type": "x", "pad": b"\0" * 70_000}), SMALL)
    assert info.value.code == "too_large"


FAST = settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(st.binary(max_size=2048))
def test_random_bytes_give_dict_or_protocol_error(payload: bytes) -> None:
    try:
        msg = decode_message(payload, SMALL)
    except ProtocolError:
        return
    assert isinstance(msg, dict) and isinstance(msg["type"], str)


@FAST
@given(st.data())
def test_truncated_messages_never_decode_wrongly(data: st.DataObject) -> None:
    t = torch.randn(data.draw(st.integers(0, 8)), 3)
    payload = encode_message({"type": "step", "hidden": encode_tensor(t), "step_id": 7})
    cut = data.draw(st.integers(0, len(payload) - 1))
    with pytest.raises(ProtocolError):
        decode_message(payload[:cut], LIMITS)


shapes = st.lists(
    st.one_of(st.integers(-3, 2**40), st.booleans(), st.floats(), st.text(max_size=2)), max_size=6
)
tensor_objs = st.fixed_dictionaries(
    {
        "dtype": st.one_of(st.sampled_from([*DTYPES, "float64", "bool", ""]), st.integers()),
        "shape": st.one_of(shapes, st.integers(), st.none()),
        "data": st.one_of(st.binary(max_size=64), st.text(max_size=4), st.none()),
    }
)


@FAST
@given(tensor_objs)
def test_random_tensor_dicts_are_checked_before_allocating(obj: dict) -> None:
    start = time.perf_counter()
    try:
        out = decode_tensor(obj, SMALL)
    except ProtocolError as e:
        assert e.code in ("bad_tensor", "too_large")
    else:
        assert out.numel() <= SMALL.max_tensor_elements
        assert out.numel() * out.element_size() == len(obj["data"])
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_all_finite_finds_every_nan_and_infinity(dtype: torch.dtype) -> None:
    x = torch.randn(3, 64).to(dtype)
    x[2, 3] = torch.finfo(dtype).max  # the largest finite value has exponent bits below all-ones
    assert all_finite(x) and all_finite(torch.empty(0, 64, dtype=dtype))
    for bad in (float("nan"), float("inf"), float("-inf")):
        for row, col in ((0, 0), (1, 37), (2, 63)):
            y = x.clone()
            y[row, col] = bad
            assert not all_finite(y), (bad, row, col)
            assert not all_finite(y.t())  # non-contiguous views take the torch path
