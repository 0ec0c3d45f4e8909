"""Coverage-guided fuzzing of dyadic.wire.decode with atheris.

    python tests/fuzz/fuzz_wire_decode.py -max_total_time=60

Property: decode either returns a message that re-encodes and decodes to the
same bytes, or raises a WireError subclass; any other exception is a crash.
The input's first byte picks the limits; inputs starting with 0x80+ get their
CRCs fixed so the fuzzer reaches the body rules.
"""

import struct
import sys
import zlib

import atheris

with atheris.instrument_imports():
    from dyadic import wire

LIMITS = (wire.Limits(vocab_size=16, max_support=8, dense_width=20, max_slots=4, max_depth=5),
          wire.DEFAULT_LIMITS,
          wire.Limits(vocab_size=1000, max_support=64, max_slots=4, max_depth=5))


def one(data):
    if not data:
        return
    sel, data = data[0], data[1:]
    if sel & 0x80 and len(data) >= 32:
        h = bytearray(data[:32])
        struct.pack_into("<I", h, 20, zlib.crc32(data[32:]))
        struct.pack_into("<I", h, 28, zlib.crc32(bytes(h[:28])))
        data = bytes(h) + data[32:]
    lim = LIMITS[sel % len(LIMITS)]
    try:
        m = wire.decode(data, limits=lim)
    except wire.WireError:
        return
    again = wire.encode(m)
    assert wire.encode(wire.decode(again, limits=lim)) == again


def main():
    atheris.Setup(sys.argv, one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
