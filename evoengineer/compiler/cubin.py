"""What a device-only build exports, read from its cubin on the CPU (no GPU, no CUDA driver): the launch traits
(`extern "C" __constant__ long long evo_trait_<name>`, templates/cuda/common/launch_traits.cuh.j2) its family's
launcher reads when it loads the module."""

from __future__ import annotations

import struct
from pathlib import Path

_SHT_SYMTAB = 2
TRAIT_PREFIX = "evo_trait_"


def cubin_traits(path: str | Path) -> dict[str, int]:
    """{name: value} of every trait the cubin exports; ValueError if the file is not a little-endian ELF64 one."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a little-endian ELF64 file (a cubin)")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    traits: dict[str, int] = {}
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != _SHT_SYMTAB or not entsize:
            continue
        strings = sections[link][4]
        for k in range(size // entsize):
            name_at, _, _, shndx, value, nbytes = struct.unpack_from("<IBBHQQ", data, offset + k * entsize)
            start = strings + name_at
            name = data[start:data.index(b"\0", start)].decode(errors="replace")
            if name.startswith(TRAIT_PREFIX) and nbytes == 8 and 0 < shndx < len(sections):
                (traits[name[len(TRAIT_PREFIX):]],) = struct.unpack_from("<q", data, sections[shndx][4] + value)
    return traits
