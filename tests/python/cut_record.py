"""Cuts one storage record of a zip written by torch (a TorchScript model, or the
archive inside a mixtrain checkpoint) short, keeping every CRC valid: the hostile
tester's edit that made libtorch read and write past a storage.

  .venv/bin/python tests/python/cut_record.py IN OUT RECORD_BYTES KEEP_BYTES

The first record under a data/ directory that holds exactly RECORD_BYTES bytes
keeps its first KEEP_BYTES. A mixtrain checkpoint (its 24-byte header first) gets
its header's size and checksum recomputed, as a careful tester would.
"""
import io
import struct
import sys
import zipfile
import zlib

MAGIC_LEN, HEADER = 8, 24  # src/core/checkpoint.cpp's kMagic and kHeaderSize


def cut(zip_bytes, record_bytes, keep):
    zin = zipfile.ZipFile(io.BytesIO(zip_bytes))
    out = io.BytesIO()
    done = False
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if not done and "/data/" in "/" + item.filename and len(data) == record_bytes:
                data, done = data[:keep], True
            zout.writestr(item, data)
    assert done, "no data/ record of %d bytes" % record_bytes
    return out.getvalue()


def main(src, dst, record_bytes, keep):
    raw = open(src, "rb").read()
    if raw.startswith(b"MIXTRAIN"):
        # a mixtrain checkpoint: magic, version, crc32 and size of the archive, then the archive
        version = raw[8:12]
        body = cut(raw[HEADER:], record_bytes, keep)
        raw = raw[:MAGIC_LEN] + version + struct.pack("<I", zlib.crc32(body) & 0xFFFFFFFF) + \
            struct.pack("<Q", len(body)) + body
    else:
        raw = cut(raw, record_bytes, keep)
    open(dst, "wb").write(raw)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
