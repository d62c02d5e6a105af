"""``python -m bench [list | report-results [--check] | SCENARIO [ARGS...]]``: list the
benchmarks, regenerate bench/README.md's results, or run one scenario's script with ARGS
passed through. The script replaces this process (exec), so its exit status, its output and
Ctrl-C (overhead.sh stops every process it started) are exactly those of running it by path.
"""

from __future__ import annotations

import os
import sys

from .catalog import BY_NAME, listing
from .recorded import report_results


def main(argv: list[str]) -> int:
    """Dispatch one command line; returns the exit status (a scenario never returns)."""
    if not argv or argv[0] in ("list", "-h", "--help", "help"):
        print(listing())
        return 0
    name, args = argv[0], argv[1:]
    if name == "report-results":
        if args not in ([], ["--check"]):
            print("usage: python -m bench report-results [--check]", file=sys.stderr)
            return 2
        return report_results(check=bool(args))
    scenario = BY_NAME.get(name)
    if scenario is None:
        print(f"python -m bench: no scenario {name!r}; python -m bench list shows them", file=sys.stderr)
        return 2
    path = str(scenario.path)
    if path.endswith(".sh"):
        os.execvp("bash", ["bash", path, *args])
    os.execv(sys.executable, [sys.executable, path, *args])
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
