"""Simulator settings from flags and YAML."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from local_backend.sim import ModelProfile, SimConfig, add_arguments, config_from_args, parse_model_flag


def parse(*argv: str) -> SimConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args(argv))


def test_defaults_match_the_documented_config() -> None:
    config = parse()
    assert config.models == {
        "sim-fast": ModelProfile(ttft_ms=15, itl_ms=2),
        "sim-strong": ModelProfile(ttft_ms=60, itl_ms=6),
    }
    assert (config.cache_model, config.block_tokens, config.cache_capacity_blocks) == ("vllm", 16, 100_000)
    assert (config.max_num_seqs, config.chunk_tokens, config.seed) == (256, 1, 0)
    assert config.require_api_key is None and not config.accept_any_model and config.faults == []


def test_model_flag() -> None:
    assert parse_model_flag("m") == ("m", ModelProfile())
    assert parse_model_flag("m:30") == ("m", ModelProfile(ttft_ms=30))
    assert parse_model_flag("m:30:4") == ("m", ModelProfile(ttft_ms=30, itl_ms=4))
    assert parse_model_flag("qwen:7b") == ("qwen:7b", ModelProfile())
    assert parse_model_flag("qwen:7b:30:4") == ("qwen:7b", ModelProfile(ttft_ms=30, itl_ms=4))


def test_flags_override_everything() -> None:
    config = parse(
        "--model", "a:1:0", "--model", "b", "--accept-any-model", "--cache-model", "openai",
        "--cache-blocks", "50", "--max-num-seqs", "3", "--require-api-key", "k", "--seed", "9",
        "--fault", "a:error=503#2", "--prefill-ms-per-1k", "100", "--chunk-tokens", "4",
        "--output-tokens", "5:7", "--cache-ttl-s", "2",
    )  # fmt: skip
    assert set(config.models) == {"a", "b"}
    assert config.models["a"] == ModelProfile(
        ttft_ms=1, itl_ms=0, prefill_ms_per_1k_tokens=100, output_tokens=(5, 7)
    )
    assert config.accept_any_model and config.cache_model == "openai" and config.cache_capacity_blocks == 50
    assert (config.max_num_seqs, config.require_api_key, config.seed, config.chunk_tokens) == (3, "k", 9, 4)
    assert config.cache_ttl_s == 2.0
    assert [(r.model, r.fault, r.count) for r in config.faults] == [("a", "error=503", 2)]


def test_yaml_config_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "sim.yaml"
    path.write_text(
        "models:\n"
        "  small: {ttft_ms: 5, itl_ms: 1, output_tokens: [2, 4]}\n"
        "  big: {ttft_ms: 50, jitter_ms: 3, embedding_dim: 8}\n"
        "cache_model: none\n"
        "max_num_seqs: 8\n"
        "faults: ['small:length=2@0.5', {model: big, fault: empty, count: 1}]\n"
    )
    config = parse("--config", str(path), "--max-num-seqs", "2")
    assert config.models["small"] == ModelProfile(ttft_ms=5, itl_ms=1, output_tokens=(2, 4))
    assert config.models["big"].embedding_dim == 8 and config.models["big"].jitter_ms == 3
    assert config.cache_model == "none" and config.max_num_seqs == 2
    assert [(r.model, r.fault, r.rate, r.count) for r in config.faults] == [
        ("small", "length=2", 0.5, None),
        ("big", "empty", 1.0, 1),
    ]


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("colour: blue\n")
    with pytest.raises(ValueError, match="colour"):
        parse("--config", str(path))
    with pytest.raises(ValueError):
        parse("--max-num-seqs", "0")
    with pytest.raises(ValueError):
        ModelProfile(output_tokens=(5, 2))
    with pytest.raises(ValueError):
        SimConfig(cache_model="lru")  # type: ignore[arg-type]
