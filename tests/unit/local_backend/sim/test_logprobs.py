"""Token logprobs in OpenAI's shapes."""

from __future__ import annotations

from local_backend.sim._logprobs import chat_logprobs, completion_logprobs, tokens_of


def test_chat_logprobs_cover_the_text_token_by_token() -> None:
    text = "the harbor light"
    out = chat_logprobs(text, 0, 3)
    assert out["refusal"] is None
    assert "".join(e["token"] for e in out["content"]) == text
    for entry in out["content"]:
        assert entry["logprob"] < 0 and entry["bytes"] == list(entry["token"].encode())
        top = entry["top_logprobs"]
        assert len(top) == 3 and top[0]["token"] == entry["token"]
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)


def test_a_chunk_carries_the_same_figures_as_the_whole_answer() -> None:
    text = "the harbor light turned slowly"
    whole = chat_logprobs(text, 0, 2)["content"]
    second_chunk = chat_logprobs(text[8:16], 2, 2)["content"]
    assert second_chunk == whole[2:4]


def test_no_top_logprobs_when_zero_asked() -> None:
    assert all(e["top_logprobs"] == [] for e in chat_logprobs("abcdefgh", 0, 0)["content"])


def test_completion_logprobs_shape() -> None:
    out = completion_logprobs("the harbor", 0, 2)
    assert out["tokens"] == tokens_of("the harbor") == ["the ", "harb", "or"]
    assert len(out["token_logprobs"]) == 3 and out["text_offset"] == [0, 4, 8]
    assert all(
        len(top) == 2 and tok in top for tok, top in zip(out["tokens"], out["top_logprobs"], strict=True)
    )
