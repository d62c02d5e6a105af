"""Run by the *installed vLLM's* Python, never imported by the gateway: check a ``vllm serve``
argv against that vLLM's own argument parser (wherever this version keeps it) and its
engine configuration, and print one JSON object on stdout.

    python _probe.py '["serve", "MODEL", "--port", "8001", ...]'

-> ``{"version": "0.32.0", "platform": "cpu", "unknown_flags": [...], "parse_error": null,
"engine_error": null, "block_size": 128}``

Standard library only (besides vLLM): the gateway's packages are not on this Python's path.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any

# Where `vllm serve`'s parser lives, newest first: it moved in vLLM 0.2x.
_PARSER_MODULES = ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args")
_FLEX_MODULES = ("vllm.utils.argparse_utils", "vllm.utils")


class _ParseError(Exception):
    pass


def _first_attr(modules: tuple[str, ...], name: str) -> Any:
    for module in modules:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"none of {modules} has {name}")


def _parser() -> argparse.ArgumentParser:
    make_arg_parser = _first_attr(_PARSER_MODULES, "make_arg_parser")
    flexible = _first_attr(_FLEX_MODULES, "FlexibleArgumentParser")
    parser: argparse.ArgumentParser = make_arg_parser(flexible())

    def error(message: str) -> Any:
        raise _ParseError(message)

    parser.error = error  # type: ignore[method-assign]
    return parser


def _unknown_flags(parser: argparse.ArgumentParser, words: list[str]) -> list[str]:
    known = parser._option_string_actions
    unknown = []
    for word in words:
        if word.startswith("-") and not _is_number(word):
            flag = word.split("=", 1)[0]
            # vLLM accepts --foo_bar as --foo-bar.
            if flag not in known and flag.replace("_", "-") not in known:
                unknown.append(flag)
    return unknown


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _available_offline(model: str) -> bool:
    if os.path.isdir(model):
        return True
    try:
        hub = importlib.import_module("huggingface_hub")
        return isinstance(hub.try_to_load_from_cache(model, "config.json"), str)
    except Exception:
        return False


def probe(argv: list[str]) -> dict[str, Any]:
    """The report for ``argv`` (``serve MODEL FLAGS...``)."""
    vllm = importlib.import_module("vllm")
    out: dict[str, Any] = {
        "version": getattr(vllm, "__version__", None),
        "platform": None,
        "unknown_flags": [],
        "parse_error": None,
        "engine_error": None,
        "block_size": None,
        "flags": [],
    }
    try:
        current_platform = importlib.import_module("vllm.platforms").current_platform
        out["platform"] = str(current_platform.device_type)
    except Exception as exc:  # a broken platform is itself worth reporting
        out["platform"] = f"unknown ({exc})"
    words = argv[1:] if argv and argv[0] == "serve" else argv
    parser = _parser()
    out["flags"] = sorted(flag for flag in parser._option_string_actions if flag.startswith("--"))
    out["unknown_flags"] = _unknown_flags(parser, words[1:])
    if out["unknown_flags"]:
        return out
    positional = any(a.dest == "model_tag" for a in parser._actions)
    # Old parsers (vllm/entrypoints/openai/cli_args.py) take the model as --model.
    words = words if positional else ["--model", words[0], *words[1:]]
    try:
        args = parser.parse_args(words)
        if positional and getattr(args, "model_tag", None):
            args.model = args.model_tag
    except _ParseError as exc:
        out["parse_error"] = str(exc)
        return out
    if not _available_offline(str(getattr(args, "model", "") or "")):
        # The engine check reads the model's config; a model still to be downloaded is
        # vLLM's business at start-up, not a reason to refuse the launch.
        return out
    try:
        engine_args = importlib.import_module("vllm.engine.arg_utils").AsyncEngineArgs
        config = engine_args.from_cli_args(args).create_engine_config()
        out["block_size"] = getattr(config.cache_config, "block_size", None)
        if out["platform"] == "cpu":
            _check_cpu_attention(config)
    except Exception as exc:
        out["engine_error"] = f"{type(exc).__name__}: {exc}"
    return out


def _check_cpu_attention(config: Any) -> None:
    """The CPU attention backend's own choice of kernels, which refuses what this CPU cannot
    run (an fp8 KV cache without AVX-512 or AMX) only once the engine starts otherwise.
    A private function of vLLM's CPU backend: where a version lacks it, nothing is checked."""
    try:
        choose = importlib.import_module("vllm.v1.attention.backends.cpu_attn")._get_attn_isa
    except (ImportError, AttributeError):
        return
    model, cache = config.model_config, config.cache_config
    choose(model.dtype, cache.block_size, model.get_head_size(), cache.cache_dtype)


def main() -> int:
    """Print the report for the argv given as a JSON list in ``sys.argv[1]``."""
    argv = json.loads(sys.argv[1])
    report = probe(argv)
    sys.stdout.write("\n" + json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
