"""Build the bundled BUG-20 sample (report.json, wowdiag.zip, wowsrc.zip) deterministically.

Run from the repository root: ``python tests/sample_src/make_sample.py``. The output goes to
``viano_bug_analysis/sample/`` and is committed; ``tests/test_sample.py`` checks that a
rebuild produces the same bytes.
"""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parent.parent / "viano_bug_analysis" / "sample"
STAMP = (2026, 11, 2, 21, 14, 0)


def build_zip(folder: Path, dest: Path) -> None:
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            info = zipfile.ZipInfo(path.relative_to(folder).as_posix(), date_time=STAMP)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o100644 << 16
            zf.writestr(info, path.read_bytes())


def main(out: Path = OUT) -> None:
    out.mkdir(parents=True, exist_ok=True)
    report = json.loads((HERE / "report.json").read_text(encoding="utf-8"))
    (out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n",
                                     encoding="utf-8")
    build_zip(HERE / "wowdiag", out / "wowdiag.zip")
    build_zip(HERE / "wowsrc", out / "wowsrc.zip")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
