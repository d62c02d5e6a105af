"""``switchyard route import-routellm``: a per-model quality file from RouteLLM's published
per-question results, for ``route eval`` and ``route fit``.

RouteLLM (github.com/lm-sys/RouteLLM, Apache-2.0) publishes, under ``routellm/evals/``, one
CSV per MMLU subject (``mmlu/responses/mmlu_<subject>.csv``) and one for GSM8K
(``gsm8k/gsm8k_responses.csv``): a ``prompt`` column and a True/False column per model, plus
the prompts it found contaminated (``<bench>/contaminated_prompts.jsonl``, ``eval_prompt``),
which are left out as RouteLLM's own evaluation leaves them out. The user fetches the
repository; nothing is downloaded here.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from gateway.routing.learn.datafiles import write_rows

WEAK = "mixtral-8x7b-instruct-v0.1"
STRONG = "gpt-4-1106-preview"


def _contaminated(folder: Path) -> set[str]:
    path = folder / "contaminated_prompts.jsonl"
    if not path.exists():
        return set()
    return {orjson.loads(line)["eval_prompt"] for line in path.read_bytes().splitlines() if line.strip()}


def _verdict(value: str, where: str) -> int:
    if value not in ("True", "False"):
        raise SystemExit(f"{where}: expected True or False, found {value!r}")
    return 1 if value == "True" else 0


def _rows(path: Path, bench: str, domain: str | None, weak: str, strong: str) -> Iterator[dict[str, Any]]:
    skip = _contaminated(path.parents[1] if bench == "mmlu" else path.parent)
    with path.open(newline="", encoding="utf-8") as f:
        for number, record in enumerate(csv.DictReader(f), start=2):
            missing = {"prompt", weak, strong} - record.keys()
            if missing:
                raise SystemExit(f"{path}: no column {', '.join(sorted(missing))} (--weak/--strong)")
            if record["prompt"] in skip:
                continue
            where = f"{path}:{number}"
            yield {
                "bench": bench,
                **({"domain": domain} if domain else {}),
                "prompt": record["prompt"],
                "weak": _verdict(record[weak], where),
                "strong": _verdict(record[strong], where),
            }


def import_evals(evals: Path, weak: str = WEAK, strong: str = STRONG) -> list[dict[str, Any]]:
    """Every MMLU and GSM8K row under RouteLLM's ``routellm/evals`` folder, decontaminated."""
    subjects = sorted((evals / "mmlu" / "responses").glob("mmlu_*.csv"))
    gsm8k = evals / "gsm8k" / "gsm8k_responses.csv"
    if not subjects and not gsm8k.exists():
        raise SystemExit(
            f"{evals}: no mmlu/responses/mmlu_*.csv nor gsm8k/gsm8k_responses.csv: give the "
            "routellm/evals folder of a RouteLLM checkout"
        )
    rows: list[dict[str, Any]] = []
    for path in subjects:
        rows += _rows(path, "mmlu", path.stem.removeprefix("mmlu_"), weak, strong)
    if gsm8k.exists():
        rows += _rows(gsm8k, "gsm8k", None, weak, strong)
    counters: dict[str, int] = {}
    for row in rows:
        n = counters.get(row["bench"], 0)
        counters[row["bench"]] = n + 1
        row["id"] = f"{row['bench']}-{n}"
    return rows


def cmd_import(args: argparse.Namespace) -> int:
    """Write the quality file and say what is in it."""
    rows = import_evals(Path(args.evals), args.weak, args.strong)
    write_rows(rows, args.out)
    needed = sum(1 for row in rows if row["strong"] > row["weak"])
    print(
        f"{len(rows)} prompts written to {args.out} ({needed / len(rows):.0%} strong needed: strong "
        "right, weak wrong)",
        file=sys.stderr,
    )
    return 0


def register_import(rsub: Any) -> None:
    """Add ``route import-routellm`` to the ``route`` subcommands."""
    p = rsub.add_parser(
        "import-routellm",
        help="a per-model quality file from RouteLLM's published per-question results",
    )
    p.add_argument("evals", help="the routellm/evals folder of a RouteLLM checkout")
    p.add_argument("--out", required=True, help="the JSONL file to write")
    p.add_argument("--weak", default=WEAK, help=f"the weak model's column (default {WEAK})")
    p.add_argument("--strong", default=STRONG, help=f"the strong model's column (default {STRONG})")
    p.set_defaults(func=cmd_import)
