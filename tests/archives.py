"""Builders of well-formed and malicious archives for intake and import tests."""

from __future__ import annotations

import io
import stat
import tarfile
import zipfile
from pathlib import Path

STAMP = (2026, 1, 1, 0, 0, 0)


def zip_with(path: Path, members: list[tuple[str, bytes]], *, mode: int | None = None,
             compression: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        for name, data in members:
            info = zipfile.ZipInfo(name, date_time=STAMP)
            info.compress_type = compression
            if mode is not None:
                info.external_attr = mode << 16
            zf.writestr(info, data)
    return path


def zip_nul_name(path: Path) -> Path:
    """A member stored as ``log.txt<NUL>.exe`` (zipfile cuts a name at NUL when it writes
    one, so the bytes are patched)."""
    zip_with(path, [("log.txtQ.exe", b"x")])
    path.write_bytes(path.read_bytes().replace(b"log.txtQ.exe", b"log.txt\x00.exe"))
    return path


def zip_utf8_unflagged(path: Path, names: list[bytes]) -> Path:
    """Members named by these UTF-8 bytes without the UTF-8 flag, as Info-ZIP's ``zip``
    writes them (zipfile flags a non-ASCII name, so ASCII stand-ins are patched)."""
    stand_ins = [f"m{i:0{len(n) - 5}d}.log".encode() for i, n in enumerate(names)]
    zip_with(path, [(s.decode(), b"x") for s in stand_ins])
    data = path.read_bytes()
    for stand_in, name in zip(stand_ins, names, strict=True):
        data = data.replace(stand_in, name)
    path.write_bytes(data)
    return path


def zip_symlink(path: Path, name: str, target: str) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("ok.txt", b"fine")
        info = zipfile.ZipInfo(name, date_time=STAMP)
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, target.encode())
    return path


def zip_special(path: Path, name: str, ftype: int) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        info = zipfile.ZipInfo(name, date_time=STAMP)
        info.external_attr = (ftype | 0o644) << 16
        zf.writestr(info, b"")
    return path


def zip_duplicate(path: Path, name: str) -> Path:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate we want
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr(name, b"one")
            zf.writestr(name, b"two")
    return path


def zip_encrypted_flag(path: Path) -> Path:
    """A member whose general-purpose flag says 'encrypted' (zipfile cannot write real
    encryption; readers must refuse on the flag alone)."""
    zip_with(path, [("secret.log", b"x" * 100)], compression=zipfile.ZIP_STORED)
    raw = bytearray(path.read_bytes())
    # Set bit 0 of the flag in the local header (offset 6) and the central header (offset 8).
    raw[6] |= 1
    central = raw.rfind(b"PK\x01\x02")
    raw[central + 8] |= 1
    path.write_bytes(bytes(raw))
    return path


def zip_unknown_method(path: Path) -> Path:
    """A member compressed with a method zipfile does not implement (97, WavPack): reading
    it raises NotImplementedError."""
    zip_with(path, [("sound.log", b"x" * 100)], compression=zipfile.ZIP_STORED)
    raw = bytearray(path.read_bytes())
    # The method: offset 8 of the local header, offset 10 of the central header.
    raw[8] = 97
    central = raw.rfind(b"PK\x01\x02")
    raw[central + 10] = 97
    path.write_bytes(bytes(raw))
    return path


def zip_lying_size(path: Path) -> Path:
    """The central directory declares a smaller size than the member really inflates to."""
    zip_with(path, [("big.log", b"A" * 5000)], compression=zipfile.ZIP_DEFLATED)
    raw = bytearray(path.read_bytes())
    central = raw.rfind(b"PK\x01\x02")
    raw[central + 24:central + 28] = (100).to_bytes(4, "little")
    local = 0
    raw[local + 22:local + 26] = (100).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    return path


def zip_lying_count(path: Path, members: int) -> Path:
    """The end-of-central-directory record declares 1 entry; the directory holds
    ``members`` (the form of a directory bomb: millions of entries declared as one)."""
    zip_with(path, [(f"m{i}", b"") for i in range(members)])
    raw = bytearray(path.read_bytes())
    end = raw.rfind(b"PK\x05\x06")
    raw[end + 8:end + 12] = (1).to_bytes(2, "little") * 2  # this disk's and the total count
    path.write_bytes(bytes(raw))
    return path


def zip_lying_count_zip64(path: Path, members: int) -> Path:
    """The same lie behind a zip64 record and locator (which zipfile reads whenever the
    locator is there): both declare 1 entry over ``members``."""
    import struct

    zip_with(path, [(f"m{i}", b"") for i in range(members)])
    raw = path.read_bytes()
    end = raw.rfind(b"PK\x05\x06")
    cd_size, cd_offset = struct.unpack("<II", raw[end + 12:end + 20])
    record = struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, 1, 1, cd_size,
                         cd_offset)
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, end, 1)
    eocd = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 1, 1, cd_size, cd_offset, 0)
    path.write_bytes(raw[:end] + record + locator + eocd)
    return path


def zip_bad_crc(path: Path) -> Path:
    zip_with(path, [("data.log", b"hello world " * 50)], compression=zipfile.ZIP_STORED)
    raw = bytearray(path.read_bytes())
    offset = raw.find(b"hello world")
    raw[offset] ^= 0xFF
    path.write_bytes(bytes(raw))
    return path


def tar_with(path: Path, members: list[tarfile.TarInfo | tuple[str, bytes]],
             mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tf:  # type: ignore[call-overload]
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                tf.addfile(m)
            else:
                info = tarfile.TarInfo(m[0])
                info.size = len(m[1])
                tf.addfile(info, io.BytesIO(m[1]))
    return path


def tar_link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info
