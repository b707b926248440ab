#!/usr/bin/env python3
"""Independent PNG check, standard library only (zlib).

usage: check_png.py FILE R G B > OUT.json

Verifies the signature and every chunk CRC (zlib.crc32), reads IHDR, inflates the IDAT
stream, checks its size, undoes the scanline filters (all five PNG filter types), and prints
{"width", "height", "color_pixels": pixels equal to (R, G, B), "columns": distinct x of those
pixels, "non_white": non-white pixels} as JSON. Exits 1 with a message on malformed input.
"""
import json
import struct
import sys
import zlib


def paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def main():
    data = open(sys.argv[1], "rb").read()
    color = tuple(int(v) for v in sys.argv[2:5])
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        sys.exit("bad signature")
    pos = 8
    idat = b""
    ihdr = None
    seen_end = False
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        ctype = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        if zlib.crc32(ctype + body) & 0xFFFFFFFF != crc:
            sys.exit("bad CRC in chunk %r" % ctype)
        if ctype == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif ctype == b"IDAT":
            idat += body
        elif ctype == b"IEND":
            seen_end = True
        pos += 12 + n
    if ihdr is None or not seen_end:
        sys.exit("missing IHDR or IEND")
    w, h, depth, ctype, _, _, interlace = ihdr
    if (depth, ctype, interlace) != (8, 2, 0):
        sys.exit("expected 8-bit RGB without interlace, got %r" % (ihdr,))
    raw = zlib.decompress(idat)
    stride = 3 * w
    if len(raw) != h * (stride + 1):
        sys.exit("inflated %d bytes, expected %d" % (len(raw), h * (stride + 1)))
    prev = bytearray(stride)
    count = 0
    non_white = 0
    columns = set()
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - 3] if i >= 3 else 0
            b = prev[i]
            c = prev[i - 3] if i >= 3 else 0
            if f == 1:
                line[i] = (line[i] + a) & 0xFF
            elif f == 2:
                line[i] = (line[i] + b) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif f == 4:
                line[i] = (line[i] + paeth(a, b, c)) & 0xFF
            elif f != 0:
                sys.exit("bad filter %d in row %d" % (f, y))
        for x in range(w):
            px = tuple(line[3 * x:3 * x + 3])
            if px == color:
                count += 1
                columns.add(x)
            if px != (255, 255, 255):
                non_white += 1
        prev = line
    json.dump({"width": w, "height": h, "color_pixels": count, "columns": len(columns),
               "non_white": non_white}, sys.stdout)


if __name__ == "__main__":
    main()
