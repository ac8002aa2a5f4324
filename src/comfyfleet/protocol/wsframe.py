"""Server-to-client WebSocket frames (RFC 6455), unmasked and uncompressed."""

from __future__ import annotations

import struct

TEXT = 0x1
BINARY = 0x2
FIN = 0x80


def encode(payload: str | bytes) -> bytes:
    """One complete frame: text for `str`, binary for `bytes`."""
    if isinstance(payload, str):
        data, opcode = payload.encode(), TEXT
    else:
        data, opcode = payload, BINARY
    size = len(data)
    if size < 126:
        header = struct.pack(">BB", FIN | opcode, size)
    elif size < 65536:
        header = struct.pack(">BBH", FIN | opcode, 126, size)
    else:
        header = struct.pack(">BBQ", FIN | opcode, 127, size)
    return header + data
