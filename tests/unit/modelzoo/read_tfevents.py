#!/usr/bin/env python3
"""Independent reader of TensorBoard event files, standard library only (the tests' second
reader, since tensorboard/tensorflow are not installed).

usage: read_tfevents.py FILE > OUT.json

Checks TFRecord framing and both masked CRC-32C values of every record (CRC-32C computed
bit by bit here), decodes each tensorflow.Event protobuf (wall_time, step, file_version,
summary values with tag and simple_value) and prints them as JSON. Exits 1 with a message on
any malformed input.
"""
import json
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    shift = 0
    value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def fields(buf):
    """Yields (field number, wire type, value) of a protobuf message."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            v, i = varint(buf, i)
        elif wire == 1:
            v = buf[i:i + 8]
            i += 8
        elif wire == 2:
            n, i = varint(buf, i)
            v = buf[i:i + n]
            i += n
        elif wire == 5:
            v = buf[i:i + 4]
            i += 4
        else:
            raise ValueError("unsupported wire type %d" % wire)
        if i > len(buf):
            raise ValueError("truncated field %d" % field)
        yield field, wire, v


def main():
    data = open(sys.argv[1], "rb").read()
    events = []
    pos = 0
    while pos < len(data):
        if pos + 12 > len(data):
            sys.exit("truncated record header at byte %d" % pos)
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (len_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if len_crc != masked(header):
            sys.exit("bad length CRC at byte %d" % pos)
        payload = data[pos + 12:pos + 12 + length]
        if len(payload) != length or pos + 16 + length > len(data):
            sys.exit("truncated record at byte %d" % pos)
        (data_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if data_crc != masked(payload):
            sys.exit("bad data CRC at byte %d" % pos)
        pos += 16 + length
        ev = {"values": []}
        for field, wire, v in fields(payload):
            if field == 1 and wire == 1:
                ev["wall_time"] = struct.unpack("<d", v)[0]
            elif field == 2 and wire == 0:
                ev["step"] = v - (1 << 64) if v >= 1 << 63 else v
            elif field == 3 and wire == 2:
                ev["file_version"] = v.decode()
            elif field == 5 and wire == 2:
                for f2, w2, val in fields(v):
                    if f2 != 1 or w2 != 2:
                        continue
                    item = {}
                    for f3, w3, x in fields(val):
                        if f3 == 1 and w3 == 2:
                            item["tag"] = x.decode()
                        elif f3 == 2 and w3 == 5:
                            item["simple_value"] = struct.unpack("<f", x)[0]
                    ev["values"].append(item)
        events.append(ev)
    json.dump(events, sys.stdout)


if __name__ == "__main__":
    main()
