"""Fold py-spy ``--format raw`` stacks into per-function tables (standard library only).

    python bench/profile_summary.py PROFILE.txt [PROFILE.txt ...] [--top N]

For each file: the share of samples per function by self time (the innermost frame)
and inclusive time (anywhere on the stack), and the self time per source file. Paths
are shortened to ``package/module.py``; line numbers are dropped so a function is one row.
Time spent in C (uvloop's loop, socket writes, orjson) is charged to the Python frame
that called it, e.g. the event loop's own work shows as ``Runner.run``.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>.*?)(?::\d+)?\)$")


def _short(path: str) -> str:
    path = re.sub(r".*/site-packages/", "", path)
    path = re.sub(r".*/lib/python3\.\d+/", "", path)
    for root in ("gateway/", "local_backend/"):
        i = path.find("/" + root)
        if i >= 0:
            return path[i + 1 :]
    return path


def _key(frame: str) -> tuple[str, str]:
    m = _FRAME.match(frame)
    if not m:
        return frame, "?"
    return m.group("func"), _short(m.group("file"))


def summarize(path: Path, top: int) -> str:
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    by_file: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_key(f) for f in stack.split(";")]
        func, file = frames[-1]
        self_time[f"{func} ({file})"] += n
        by_file[file] += n
        for name in {f"{fn} ({fl})" for fn, fl in frames}:
            inclusive[name] += n
    if not total:
        return f"{path}: no samples\n"
    out = [f"{path}: {total} samples"]
    for title, counter in (("self", self_time), ("inclusive", inclusive), ("self by file", by_file)):
        out.append(f"  -- {title}")
        out += [f"  {100.0 * v / total:5.1f}%  {k}" for k, v in counter.most_common(top)]
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    for f in args.files:
        print(summarize(f, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
