"""Token log-probabilities in OpenAI's shapes, for the simulator's 4-character tokens.

A token of the answer is 4 characters of its text (the simulator's tokenizer, as
:func:`local_backend.sim._tokens.token_count` counts it); its log-probability and its
alternatives are derived from the token and its position, so the same answer always
carries the same figures. The chosen token is always the most likely one (greedy), as
``top_logprobs`` then shows.
"""

from __future__ import annotations

import zlib
from typing import Any

from local_backend.sim._tokens import BYTES_PER_TOKEN

MAX_TOP_LOGPROBS = 20
"""OpenAI's bound on chat ``top_logprobs``."""
MAX_COMPLETION_LOGPROBS = 5
"""OpenAI's bound on the completions endpoint's ``logprobs``."""

_ALTERNATIVES = ("the", " and", " a", "ing", " of", " to", "ed", " in", "er", " is", "s", ",", ".", " it",
                 " was", " for", "ly", " on", " that", " with", " as")  # fmt: skip


def tokens_of(text: str) -> list[str]:
    """``text`` cut into the simulator's tokens (the last one possibly short)."""
    return [text[i : i + BYTES_PER_TOKEN] for i in range(0, len(text), BYTES_PER_TOKEN)]


def _logprob(token: str, position: int) -> float:
    # Between -0.001 and about -0.5: a confident model, as a greedy sample looks.
    h = zlib.crc32(token.encode(), position)
    return -round(0.001 + (h % 5000) / 10_000, 4)


def _alternatives(token: str, position: int, chosen: float, count: int) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    start = zlib.crc32(token.encode(), position + 7) % len(_ALTERNATIVES)
    logprob = chosen
    for i in range(len(_ALTERNATIVES)):
        if len(out) >= count:
            break
        alt = _ALTERNATIVES[(start + i) % len(_ALTERNATIVES)]
        if alt == token:
            continue
        logprob = round(logprob - 0.75 - (zlib.crc32(alt.encode(), position) % 100) / 50, 4)
        out.append((alt, logprob))
    return out


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def chat_logprobs(text: str, first_token: int, top: int) -> dict[str, Any]:
    """Chat's ``logprobs`` object for ``text``, whose first token is token ``first_token`` of
    the answer (a stream's chunk); ``top`` alternatives per token (0 to 20)."""
    content = []
    for i, token in enumerate(tokens_of(text)):
        position = first_token + i
        logprob = _logprob(token, position)
        entry = _entry(token, logprob)
        alternatives = [(token, logprob), *_alternatives(token, position, logprob, top - 1)] if top else []
        entry["top_logprobs"] = [_entry(t, lp) for t, lp in alternatives]
        content.append(entry)
    return {"content": content, "refusal": None}


def completion_logprobs(text: str, first_token: int, top: int, text_offset: int = 0) -> dict[str, Any]:
    """The completions endpoint's ``logprobs`` object (``tokens``, ``token_logprobs``,
    ``top_logprobs`` as token -> logprob maps, ``text_offset``)."""
    tokens = tokens_of(text)
    logprobs = [_logprob(t, first_token + i) for i, t in enumerate(tokens)]
    tops = [
        dict([(t, lp), *_alternatives(t, first_token + i, lp, top - 1)]) if top else {}
        for i, (t, lp) in enumerate(zip(tokens, logprobs, strict=True))
    ]
    offsets = [text_offset + i * BYTES_PER_TOKEN for i in range(len(tokens))]
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}
