"""Every byte read from an archive counts against the limits, headers included, and peak
memory stays bounded whatever the archive holds — proved under an address-space limit."""

from __future__ import annotations

import gzip
import io
import json
import resource
import struct
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.conftest import VIANO, Cli, child_env

HEADER_BYTES = 768 * 1024 * 1024   # what the archive's one header claims and holds
ADDRESS_SPACE = 512 * 1024 * 1024  # the child's whole address space: less than the header


def _tar_header(name: bytes, size: int, typeflag: bytes) -> bytes:
    block = bytearray(512)
    block[0:len(name)] = name
    block[100:108] = b"0000644\x00"
    block[108:116] = b"0000000\x00"
    block[116:124] = b"0000000\x00"
    block[124:136] = f"{size:011o}\x00".encode()
    block[136:148] = b"00000000000\x00"
    block[156:157] = typeflag
    block[257:263] = b"ustar\x00"
    block[263:265] = b"00"
    block[148:156] = b" " * 8
    block[148:156] = f"{sum(block):06o}\x00 ".encode()
    return bytes(block)


def _bomb(path: Path, typeflag: bytes) -> Path:
    """A small tar.gz whose first header (pax 'x' or GNU long-name 'L') is HEADER_BYTES of
    real, highly compressible content, followed by one ordinary member."""
    if typeflag == b"x":
        # One pax record: "<len> comment=<value>\n", its length counting itself.
        body_len = HEADER_BYTES
        prefix = b" comment="
        digits = len(str(body_len))
        value_len = body_len - digits - len(prefix) - 1
        head = str(body_len).encode() + prefix
    else:
        value_len = HEADER_BYTES - 1
        head = b""
    with gzip.open(path, "wb", compresslevel=1) as out:
        out.write(_tar_header(b"././@PaxHeader" if typeflag == b"x" else b"././@LongLink",
                              HEADER_BYTES, typeflag))
        out.write(head)
        chunk = b"a" * (1 << 20)
        left = value_len
        while left:
            n = min(left, len(chunk))
            out.write(chunk[:n])
            left -= n
        out.write(b"\n" if typeflag == b"x" else b"\x00")
        out.write(b"\x00" * (-HEADER_BYTES % 512))
        out.write(_tar_header(b"Logs/a.log", 5, b"0") + b"hello" + b"\x00" * 507)
        out.write(b"\x00" * 1024)
    return path


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


@pytest.mark.slow
class TestHeadersUnderAnAddressSpaceLimit:
    @pytest.mark.parametrize("typeflag", [b"x", b"L"], ids=["pax header", "GNU long name"])
    def test_a_header_bomb_is_refused_within_bounded_memory(self, tmp_path: Path,
                                                            typeflag: bytes) -> None:
        """The intake runs in a child limited to 512 MiB of address space; the archive's
        one header holds 768 MiB. It is refused (limit_exceeded, exit 2), not a memory
        error, and nothing is written."""
        bomb = _bomb(tmp_path / "diag.tar.gz", typeflag)
        assert bomb.stat().st_size < 16 * 1024 * 1024
        report = tmp_path / "r.json"
        report.write_text('{"title": "t", "body": "b"}')
        proc = subprocess.run([*VIANO,
                               "intake", "--json", "--store", str(tmp_path / "s"), "--report",
                               str(report), "--attach", f"diagnostics={bomb}"],
                              capture_output=True, text=True, env=child_env(), timeout=300,
                              preexec_fn=_limit, check=False)
        assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr[-2000:])
        doc = json.loads(proc.stdout)
        assert doc["error"]["reason"] == "limit_exceeded", doc
        assert not (tmp_path / "s").exists()

    def test_the_limit_leaves_room_for_a_normal_intake(self, tmp_path: Path,
                                                       sample: Path) -> None:
        """The same address-space limit is ample for an ordinary intake (so the refusal
        above is the bound at work, not the limit starving the process)."""
        proc = subprocess.run([*VIANO,
                               "intake", "--json", "--store", str(tmp_path / "s"), "--report",
                               str(sample / "report.json"), "--attach",
                               f"diagnostics={sample / 'wowdiag.zip'}"],
                              capture_output=True, text=True, env=child_env(), timeout=300,
                              preexec_fn=_limit, check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]


class TestHeadersCount:
    def test_header_bytes_count_against_max_total_bytes(self, cli: Cli, tmp_path: Path) -> None:
        """Long names whose headers alone pass max_total_bytes are refused, although the
        members themselves are tiny."""
        cfg = tmp_path / "c.toml"
        cfg.write_text("[intake.limits]\nmax_member_bytes = 10000\nmax_total_bytes = 20000\n")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tf:
            for i in range(6):
                info = tarfile.TarInfo(f"d{i}/" + "n" * 4000)
                info.size = 1
                tf.addfile(info, io.BytesIO(b"x"))
        bomb = tmp_path / "names.tar.gz"
        bomb.write_bytes(buf.getvalue())
        report = tmp_path / "r.json"
        report.write_text('{"title": "t", "body": "b"}')
        r = cli("intake", "--json", "--config", cfg, "--store", tmp_path / "s", "--report",
                report, "--attach", f"diagnostics={bomb}")
        assert r.code == 2 and r.json["error"]["reason"] == "limit_exceeded"  # type: ignore[index]
        assert "headers included" in r.json["error"]["message"]  # type: ignore[index]

    def test_a_zip_declaring_too_many_entries_is_refused_before_reading(
            self, cli: Cli, tmp_path: Path) -> None:
        """The end-of-central-directory record is checked before zipfile builds an object
        per entry: a zip64 record declaring ten million entries is refused at once."""
        path = tmp_path / "many.zip"
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("a.log", b"a")
        raw = bytearray(path.read_bytes())
        eocd = raw.rfind(b"PK\x05\x06")
        cd_size, cd_offset = struct.unpack("<II", raw[eocd + 12:eocd + 20])
        zip64 = struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, 10_000_000,
                            10_000_000, cd_size, cd_offset)
        locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, eocd, 1)
        end = bytearray(raw[eocd:])
        end[8:12] = b"\xff\xff\xff\xff"
        path.write_bytes(bytes(raw[:eocd]) + zip64 + locator + bytes(end))
        report = tmp_path / "r.json"
        report.write_text('{"title": "t", "body": "b"}')
        r = cli("intake", "--json", "--store", tmp_path / "s", "--report", report,
                "--attach", f"diagnostics={path}")
        assert r.code == 2 and r.json["error"]["reason"] == "limit_exceeded", r.out  # type: ignore[index]
        assert "10000000 members" in r.json["error"]["message"]  # type: ignore[index]
