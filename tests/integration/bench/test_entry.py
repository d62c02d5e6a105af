"""``python -m bench``: it lists every scenario and runs its script with the arguments passed
through; bench/README.md's results section is exactly what the committed result files
generate; the benchmark pages' links and file lists stay true."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.catalog import BENCH_DIR, SCENARIOS
from bench.recorded import README, RECORDED_DIR, RecordError, records, regenerated
from tests.helpers import ROOT
from tests.unit.test_docs import anchors


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], capture_output=True, text=True, cwd=ROOT, timeout=60
    )


def test_the_list_names_every_scenario_and_each_script_exists() -> None:
    for args in ((), ("list",)):
        done = bench(*args)
        assert done.returncode == 0, done.stderr
        scenarios, _, elsewhere = done.stdout.partition("\nElsewhere:")
        listed = re.findall(r"^  (\S+)  ", scenarios, re.M)
        assert [s.name for s in SCENARIOS] == [name for name in listed if name != "report-results"]
    for scenario in SCENARIOS:
        assert scenario.path.is_file(), scenario
    # `switchyard bench` is another tool; the list says so.
    assert "switchyard bench run|compare" in elsewhere


def test_every_scenario_has_a_row_in_the_readme() -> None:
    text = README.read_text()
    for scenario in SCENARIOS:
        assert f"| `{scenario.name}` | `{scenario.script}` |" in text, scenario.name


def test_a_scenario_runs_its_script_with_the_arguments_passed_through() -> None:
    done = bench("hold", "--help")
    assert done.returncode == 0, done.stderr
    assert "--streams" in done.stdout and "--ramp-s" in done.stdout  # hold.py's own usage
    # The script's exit status comes back: hold.py refuses a missing --url with 2.
    assert bench("hold").returncode == 2


def test_an_unknown_scenario_is_one_line_and_exit_2() -> None:
    done = bench("no-such-scenario")
    assert done.returncode == 2
    assert done.stderr == "python -m bench: no scenario 'no-such-scenario'; python -m bench list shows them\n"


def test_the_results_section_is_what_the_result_files_generate() -> None:
    text = README.read_text()
    assert regenerated(text) == text, "run python -m bench report-results"
    assert bench("report-results", "--check").returncode == 0


def test_a_changed_result_file_makes_the_section_stale(tmp_path: Path) -> None:
    copy = tmp_path / "recorded"
    shutil.copytree(RECORDED_DIR, copy)
    first = sorted(copy.glob("*.json"))[0]
    record = json.loads(first.read_text())
    record["commit"] = "0000000 (changed)"
    first.write_text(json.dumps(record))
    assert regenerated(README.read_text(), copy) != README.read_text()


def test_every_result_file_states_when_where_and_how_noisy(tmp_path: Path) -> None:
    found = records()
    assert len(found) >= 5 and {r["scenario"] for r in found} >= {"overhead", "soak"}
    bad = tmp_path / "2026-01-01-bad.json"
    record = json.loads(next(RECORDED_DIR.glob("*.json")).read_text())
    del record["noise"]
    bad.write_text(json.dumps(record))
    with pytest.raises(RecordError, match=r"2026-01-01-bad\.json: missing noise"):
        records(tmp_path)


def test_every_probe_is_listed_with_its_finding() -> None:
    listed = set(re.findall(r"^\| `(\w+\.py)` \|", (BENCH_DIR / "probes" / "README.md").read_text(), re.M))
    assert listed == {p.name for p in (BENCH_DIR / "probes").glob("*.py")}


@pytest.mark.parametrize("page", [README, BENCH_DIR / "probes" / "README.md"], ids=lambda p: p.parent.name)
def test_the_bench_pages_links_resolve(page: Path) -> None:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        if not linked.exists() or (anchor and anchor not in anchors(linked)):
            broken.append(target)
    assert not broken, broken
