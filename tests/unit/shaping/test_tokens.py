"""A launched vLLM's own tokenizer counts the stable prefix (the shaping header) and sets the
bytes per token the prefix-hit expectations use; without one, the calibrated estimate."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gateway.cachestats.prefix import GEOMETRY
from gateway.config import PolicySnapshot, parse_policy
from gateway.context import RequestContext
from gateway.shaping.service import ShapingState
from gateway.shaping.tokens import TOKENIZERS

tokenizers = pytest.importorskip("tokenizers")

# Long words, one token each in the test's word-level vocabulary: a count far from bytes / 4.
WORDS = ["internationalization", "configuration", "responsibility", "documentation", "."]
SYSTEM = " ".join(["internationalization configuration responsibility documentation ."] * 60)
WORD_COUNT = 5 * 60


def _model_dir(path: Path, with_tokenizer: bool = True) -> Path:
    """A model directory with a small word-level ``tokenizer.json`` (built here, nothing downloaded)."""
    path.mkdir(parents=True, exist_ok=True)
    if with_tokenizer:
        vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
        tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
        tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
        tokenizer.save(str(path / "tokenizer.json"))
    return path


def _snapshot(name: str, model_dir: Path, launched: bool = True) -> PolicySnapshot:
    launch = f', launch: {{model: "{model_dir}", port: 18401}}' if launched else ""
    policy = parse_policy(
        f"""
deployments:
  {name}: {{provider: vllm, base_url: "http://127.0.0.1:18401/v1", model: "{model_dir}"{launch}}}
tiers: {{fast: [{name}]}}
shaping: {{deployment_placement: {{{name}: end_of_system}}}}
""",
        "p",
    )
    return PolicySnapshot(policy=policy, source="p", digest=name, version=1)


def _request(state: ShapingState, snapshot: PolicySnapshot, name: str, user: str) -> RequestContext:
    ctx = RequestContext(request_id="r", endpoint="/v1/chat/completions", snapshot=snapshot)
    body: dict[str, Any] = {
        "model": name,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
    }
    state.shape(ctx, body, None, None)
    ctx.deployment = name
    state.prefix_hit(ctx)
    return ctx


def test_the_stable_prefix_is_counted_with_the_launched_models_tokenizer(tmp_path: Path) -> None:
    name = "tok-launched"
    snapshot = _snapshot(name, _model_dir(tmp_path / "model"))

    async def run() -> tuple[int, int, float]:
        state = ShapingState()
        _request(state, snapshot, name, "hi")  # asks for the tokenizer (loaded in the background)
        await TOKENIZERS.settled()
        _request(state, snapshot, name, "hello")  # counts the template's stable prefix
        await TOKENIZERS.settled()
        ctx = _request(state, snapshot, name, "hey")
        assert ctx.shape is not None
        return ctx.shape.stable_prefix_tokens, ctx.prefix_hit_tokens or 0, GEOMETRY.bytes_per_token(name)

    tokens, hit, ratio = asyncio.run(run())
    # The model's own count of the system prompt: one token per word (bytes / 4 says ~1,000).
    assert tokens == WORD_COUNT
    assert ratio == pytest.approx(len(SYSTEM) / WORD_COUNT)
    # The expected hit is in the same tokens: never more than the prompt's own count.
    assert 0 < hit <= WORD_COUNT + 4


def test_without_a_tokenizer_the_estimate_never_exceeds_the_prompt(tmp_path: Path) -> None:
    for name, model_dir, launched in (
        ("tok-no-file", _model_dir(tmp_path / "bare", with_tokenizer=False), True),
        ("tok-not-launched", _model_dir(tmp_path / "remote"), False),
    ):
        snapshot = _snapshot(name, model_dir, launched)

        async def run(snapshot: PolicySnapshot = snapshot, name: str = name) -> int:
            state = ShapingState()
            _request(state, snapshot, name, "hi")
            await TOKENIZERS.settled()
            ctx = _request(state, snapshot, name, "hello")
            assert ctx.shape is not None and ctx.prefix_chain is not None
            prompt = GEOMETRY.estimate(name, ctx.prefix_chain.prompt_bytes)  # type: ignore[attr-defined]
            assert ctx.shape.stable_prefix_tokens <= prompt
            return ctx.shape.stable_prefix_tokens

        # Bytes over the calibrated bytes per token (4 until the deployment replies).
        assert asyncio.run(run()) == len(SYSTEM) // 4, name
