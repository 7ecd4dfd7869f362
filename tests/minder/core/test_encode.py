"""The encoder side of the codec (:mod:`minder.core.encode`): the bytes numpy's float32 packing
gave, without numpy (issue 14: the agent's process does not load it)."""

from __future__ import annotations

import math
import random
import subprocess
import sys
import warnings

import msgpack
import numpy as np
import pytest

from minder.core import codec, encode
from minder.core.encode import BatchEncoder, encode_batch
from minder.core.errors import DecodeError
from minder.core.records import Event, EventKind, NodeBatch
from minder.core.wire import WireFormat

T0 = 1763700000.0


def _batch(values: list[float], ts: float = T0) -> NodeBatch:
    samples = [("gpu_power_watts", f"gpu{i}", v) for i, v in enumerate(values)]
    events = [Event(EventKind.XID, "gpu0", ts, code=79, message="fell off the bus")]
    return NodeBatch("j", "n1", ts, labels={"group": "pp0"}, samples=samples, events=events)


def _random_values(rng: random.Random, n: int) -> list[float]:
    """Finite doubles across float32's range: normal, subnormal, rounding ties, zero, -0."""
    out: list[float] = []
    for _ in range(n):
        kind = rng.randrange(6)
        if kind == 0:
            out.append(rng.uniform(-1e6, 1e6))
        elif kind == 1:
            out.append(math.ldexp(rng.random(), rng.randrange(-160, 128)))  # down to subnormals
        elif kind == 2:
            out.append(-math.ldexp(rng.random(), rng.randrange(-126, 128)))
        elif kind == 3:  # exactly halfway between two float32s: round half to even
            f = np.float32(rng.uniform(1, 2**20))
            out.append(float(f) + float(np.spacing(f)) / 2)
        elif kind == 4:
            out.append(float(rng.randrange(-(2**40), 2**40)))
        else:
            out.append(rng.choice([0.0, -0.0, 3.4028234663852886e38, -1.401298464324817e-45]))
    return out


def _numpy_packed(values: list[float]) -> bytes:
    """What the codec packed before: numpy's little-endian float32 cast."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # overflow to inf
        return np.asarray(values, dtype="<f4").tobytes()


def test_values_are_numpys_float32_bytes_for_random_finite_values() -> None:
    rng = random.Random(14)
    for n in (1, 2, 7, 64, 300):
        for _ in range(40):
            values = _random_values(rng, n)
            assert encode._unzip(_batch(values))[2] == _numpy_packed(values)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@pytest.mark.parametrize(
    "values",
    [
        [math.nan, -math.nan, math.inf, -math.inf, 1.0],
        [1e39, -1e39, 3.4028236e38, 0.5],  # beyond float32: inf, as numpy says
        [True, 2, 0.5],  # not floats, still numbers
    ],
    ids=["non_finite", "beyond_float32", "ints_and_bools"],
)
def test_values_that_are_not_plain_finite_floats_pack_as_before(values: list[float]) -> None:
    assert encode._unzip(_batch(values))[2] == _numpy_packed(values)


def test_whole_messages_are_the_ones_numpy_packing_gave() -> None:
    """The envelope around the values is built as before: only the packing changed, so a
    message equals one built with numpy's bytes in its ``values``."""
    rng = random.Random(7)
    encoder = BatchEncoder(announce_every=3)
    for i in range(7):
        batch = _batch(_random_values(rng, 40), T0 + i)
        metrics, devices, _ = encode._unzip(batch)
        got = encoder.encode(batch)
        fields = msgpack.unpackb(got, raw=False)
        inline = "layout_def" in fields
        expected = encode._packed_dict(
            batch,
            encode.layout_id(metrics, devices),
            _numpy_packed([v for _, _, v in batch.samples]),
            encode.layout_definition(metrics, devices) if inline else None,
        )
        assert got == msgpack.packb(expected, use_bin_type=True)
        assert inline == (i % 3 == 0)
    one_off = _batch([0.25, 1.5e30])
    assert msgpack.unpackb(encode_batch(one_off, WireFormat.PACKED))["values"] == _numpy_packed(
        [0.25, 1.5e30]
    )


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_non_finite_values_are_still_refused_by_the_decoder() -> None:
    for bad, shown in ((math.nan, "nan"), (math.inf, "inf"), (1e39, "inf"), (-math.inf, "-inf")):
        payload = encode_batch(_batch([300.0, bad]), WireFormat.PACKED)
        with pytest.raises(
            DecodeError,
            match=rf"^values\[1\] gpu_power_watts\{{gpu1\}} is {shown}: expected a finite number",
        ):
            codec.Decoder().decode(payload)


def test_a_decoded_packed_batch_encodes_again() -> None:
    values = [300.0, 0.5, 1e-3]
    decoded = codec.Decoder().decode(encode_batch(_batch(values), WireFormat.PACKED))
    assert decoded.values is not None and decoded.values.dtype == np.float32
    payload = msgpack.unpackb(BatchEncoder().encode(decoded))
    assert payload["values"] == _numpy_packed(values)
    assert codec.decode_batch(encode_batch(decoded, WireFormat.JSON)).samples == [
        (m, d, float(np.float32(v))) for m, d, v in _batch(values).samples
    ]


def test_the_codec_re_exports_the_encoder() -> None:
    for name in encode.__all__:
        assert getattr(codec, name) is getattr(encode, name), name
        assert name in codec.__all__


ENCODE_ONLY = """
import sys
from minder.core.encode import BatchEncoder, encode_batch
from minder.core.records import NodeBatch
from minder.core.wire import WireFormat

batch = NodeBatch("j", "n", 1763700000.0, samples=[("gpu_power_watts", "gpu0", 300.0)])
encoder = BatchEncoder()
sizes = [len(encoder.encode(batch)) for _ in range(3)]
sizes += [len(encode_batch(batch, fmt)) for fmt in WireFormat]
assert all(sizes), sizes
print(sorted(m for m in ("numpy", "orjson", "msgpack") if m in sys.modules))
"""


def test_encoding_loads_no_numpy() -> None:
    done = subprocess.run(
        [sys.executable, "-c", ENCODE_ONLY], capture_output=True, text=True, check=True, timeout=60
    )
    # orjson only for the JSON format, asked for last
    assert done.stdout.split("\n")[-2] == "['msgpack', 'orjson']"
