"""The README and docs/ stay true to the code: every ``switchyard ...`` command they show
names real subcommands and real flags of that subcommand, every other ``--flag`` they
mention exists somewhere in the CLI (or is a listed flag of another program), and every
relative link, anchors included, resolves."""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from pathlib import Path

import pytest

from gateway.cli import build_parser
from tests.helpers import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Flags the docs mention that belong to other programs. A flag of Switchyard's own CLI
# never needs to be here.
FOREIGN_FLAGS = {
    # vllm serve (docs/local-backend.md maps knobs to these)
    "--served-model-name", "--kv-cache-dtype", "--enable-prefix-caching", "--no-enable-prefix-caching",
    "--enable-prompt-tokens-details", "--speculative-config", "--tensor-parallel-size",
    "--pipeline-parallel-size", "--max-num-batched-tokens", "--gpu-memory-utilization",
    "--max-model-len", "--quantization", "--calculate-kv-scales", "--dtype", "--block-size",
    "--enable-chunked-prefill", "--enforce-eager", "--trust-remote-code", "--data-parallel-size",
    "--shutdown-timeout",
    "--flag", "--no-flag", "--no-",
    # bench/overhead.sh, docker compose, redis-server, ruff, mypy
    "--litellm", "--full", "--peers", "--cache", "--modes", "--repeat", "--no-http", "--build", "--profile", "--cluster-enabled", "--check", "--strict", "--keep",
    # bench/shaping.py, bench/probes/shaping_instructions.py
    "--cost-only", "--baseline", "--rounds", "--corpus-only", "--sessions", "--against", "--steps",
    # bench/routing_features.py
    "--embedding", "--index", "--tools", "--choices",
    # sglang's server (docs/providers.md)
    "--enable-cache-report",
}  # fmt: skip


def parsers() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every (sub)command path of ``switchyard`` and its parser."""
    found: dict[tuple[str, ...], argparse.ArgumentParser] = {}

    def walk(path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
        found[path] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk((*path, name), child)

    walk((), build_parser())
    return found


PARSERS = parsers()


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {opt for action in parser._actions for opt in action.option_strings}


ALL_OPTIONS = set().union(*(options(p) for p in PARSERS.values()))


def text_of(path: Path) -> str:
    # A shell line continued with a backslash is one command.
    return re.sub(r"\\\n\s*", " ", path.read_text())


COMMAND = re.compile(r"(?:^|[\s`/(])switchyard((?: +[^\s`|#;&)]+)+)", re.M)


def commands() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        for match in COMMAND.finditer(text_of(path)):
            found.append((path.name, "switchyard" + match.group(1)))
    return found


def test_the_docs_show_commands() -> None:
    assert len(commands()) > 20


@pytest.mark.parametrize(("doc", "command"), commands())
def test_every_switchyard_command_is_real(doc: str, command: str) -> None:
    words = shlex.split(command.replace("[", " ").replace("]", " "))[1:]
    path: tuple[str, ...] = ()
    while words and (*path, words[0]) in PARSERS:
        path = (*path, words.pop(0))
    assert path, f"{doc}: {command!r} names no subcommand"
    parser = PARSERS[path]
    subcommands = [p[-1] for p in PARSERS if p[:-1] == path and len(p) == len(path) + 1]
    # A bare group (`switchyard bench`) may be named in prose; arguments need a subcommand.
    assert not (subcommands and words), f"{doc}: {command!r} stops before a subcommand of {subcommands}"
    for word in words:
        flag = word.split("=", 1)[0]
        if flag.startswith("--"):
            assert flag in options(parser), f"{doc}: {command!r}: {' '.join(path)} has no {flag}"


def test_every_flag_the_docs_mention_exists() -> None:
    unknown = set()
    for path in DOCS:
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text_of(path)):
            if flag not in ALL_OPTIONS and flag not in FOREIGN_FLAGS:
                unknown.add(f"{path.name}: {flag}")
    assert not unknown, sorted(unknown)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, fence = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


def test_relative_links_resolve() -> None:
    broken = []
    for path in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"^[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                broken.append(f"{path.name}: {target}")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{path.name}: {target} (no such heading)")
    assert not broken, broken


def test_the_readme_keeps_the_ci_command_markers() -> None:
    text = (ROOT / "README.md").read_text()
    for marker in ("<!-- serve-command -->", "<!-- test-command -->"):
        assert re.search(re.escape(marker) + r"\n```sh\n.+\n```", text), marker


REPO_PATH = re.compile(r"`((?:gateway|local_backend|tests|bench|deploy|policies)/[\w./-]*)")
MODULE_PATH = re.compile(r"`((?:gateway|local_backend)(?:\.\w+)+)")


def test_files_and_modules_the_docs_name_exist() -> None:
    """A doc that names a file or a Python object must follow it when it moves."""
    missing = []
    for path in DOCS:
        text = path.read_text()
        for name in REPO_PATH.findall(text):
            if not (ROOT / name.rstrip(".")).exists():
                missing.append(f"{path.name}: {name}")
        for dotted in MODULE_PATH.findall(text):
            parts = dotted.split(".")
            for cut in range(len(parts), 0, -1):
                try:
                    obj: object = importlib.import_module(".".join(parts[:cut]))
                except ImportError:
                    continue
                try:
                    for attr in parts[cut:]:
                        obj = getattr(obj, attr)
                except AttributeError:
                    missing.append(f"{path.name}: {dotted}")
                break
            else:
                missing.append(f"{path.name}: {dotted}")
    assert not missing, missing
