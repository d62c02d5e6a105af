"""Shaping's cost as instructions executed: a figure the machine's speed does not move.

``bench/shaping.py --cost-only`` reports CPU microseconds, and on a shared VM the same code
gave 101 to 182 µs for one row within a day: a change of 10 % cannot be seen. This counts
the instructions of the step that bench times (``PolicyShaper.shape`` and the checkpoint
chain, on the bench's own prompts) with valgrind's callgrind, counting only inside the
step: each call runs inside ``functools.reduce``, the one C function callgrind is told to
count within (the signature sample, capped per second, on a clock running at the bench's
own pace). The figure is the steady state: the count after ``--runs`` requests less the
count after a third of them, per request in between. With ``PYTHONHASHSEED`` fixed, a rerun
gives the same figure within 1 %.

Instructions are not time: a copy of 50 KB is a few thousand instructions and costs more
than that suggests. Use it to see whether a change removed work, and the µs bench (in an
alternating run, ``--baseline``) to see what it saved.

    python bench/probes/shaping_instructions.py [--against CHECKOUT] [--rows 556:new,tools]
        [--steps MODULE:NAME,...]

``CHECKOUT`` is another tree (``git archive <rev> | tar -x -C DIR``); a row is
``LINES:PATTERN`` (40, 130 or 556 system lines; ``one``, ``50`` or ``new`` conversations)
or ``tools``. ``--steps`` counts other functions instead of the whole step, each named where
its caller looks it up (``gateway.shaping.heads:HeadReader.read``; a function another
module imported by name is patched in that module: ``gateway.shaping.heads:same_shape``).
Name one, or several that do not call one another: callgrind's switch flips again inside
a nested one. Needs valgrind (``apt-get install valgrind``); a row takes about a minute a
side, the two sides run at once.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import importlib
import itertools
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[2]
WHOLE_STEP = "gateway.shaping.shaper:PolicyShaper.shape,gateway.cachestats.chain:checkpoints"
"""What ``bench/shaping.py --cost-only`` times: the shaper, then the prompt's checkpoint chain."""
PATTERNS = {"one": "one conversation", "50": "50 interleaved", "new": "new conversation each request"}


def _counted(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, called inside ``functools.reduce`` (where callgrind counts)."""

    def inside(*args: Any, **kwargs: Any) -> Any:
        return functools.reduce(lambda _, __: function(*args, **kwargs), (None,), None)

    return inside


def _child(root: str, row: str, runs: int, steps: str) -> None:
    """Run ``row`` of the cost bench ``runs`` times against ``root``'s gateway, ``steps`` (see
    ``--steps``) counted."""
    sys.argv = [sys.argv[0], "--import-root", root]  # read by bench/shaping.py at import
    sys.path.insert(0, str(HERE))
    shaping = importlib.import_module("bench.shaping")  # first: it puts ``root`` on the path
    signature = importlib.import_module("gateway.shaping.signature")
    if hasattr(signature, "_now"):
        # The signature sample is capped per second, and under valgrind a second holds 50
        # times fewer requests: its clock runs as at the bench's own ~8,000 requests a second
        # (read once per ten requests of a template, past its first 20).
        ticks = itertools.count()
        signature._now = lambda: next(ticks) * 10 / 8000
    for step in steps.split(","):
        module, _, name = step.partition(":")
        owner: Any = importlib.import_module(module)
        *path, attribute = name.split(".")
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, attribute, _counted(getattr(owner, attribute)))
    if row == "tools":
        shaping.tools_cost(runs=runs)
    else:
        lines, pattern = row.split(":")
        shaping.shaping_cost(int(lines), runs=runs, agent=lines == "556", pattern=PATTERNS[pattern])


def _count(root: Path, row: str, runs: int, steps: str) -> int:
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", "--collect-atstart=no"]
    command += ["--toggle-collect=functools_reduce", sys.executable, __file__]
    command += ["--child", str(root), row, str(runs), steps]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode or found is None:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def per_request(root: Path, row: str, runs: int, steps: str = WHOLE_STEP) -> float:
    """Instructions a request, between request ``runs // 3`` and ``runs``."""
    first = runs // 3
    return (_count(root, row, runs, steps) - _count(root, row, first, steps)) / (runs - first)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", metavar="CHECKOUT", help="another tree to count as well")
    parser.add_argument("--rows", default="556:new,tools", help="comma-separated rows (see above)")
    parser.add_argument("--runs", type=int, default=600)
    parser.add_argument("--steps", default=WHOLE_STEP, help="the functions counted (see above)")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        root, row, runs, steps = args.child
        _child(root, row, int(runs), steps)
        return 0
    sides = {"this checkout": HERE}
    if args.against:
        sides[args.against] = Path(args.against).resolve()
    print("| row | " + " | ".join(sides) + " |")
    print("|---|" + "---|" * len(sides))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for row in args.rows.split(","):
            count = functools.partial(per_request, row=row, runs=args.runs, steps=args.steps)
            counts = pool.map(count, sides.values())
            print(f"| {row} | " + " | ".join(f"{count:,.0f}" for count in counts) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
