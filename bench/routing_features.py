"""Cost of routing a request: feature extraction and the whole routing decision.

    python bench/routing_features.py [--tokens 8000] [--runs 2000] [--tools 0]

Prints the median and p99 microseconds per call (perf_counter around each call, after a
warm-up), for a chat request whose last user message is about --tokens tokens of prose,
a code block and a few questions: feature extraction, then the whole decision with the
``linear`` classifier and with the ``ngram`` one (shipped weights). The ngram classifier
memoizes each word pair's weight and each message's logit per process, so it is timed three
times: the same message again (an agent's next tool-loop step, a retry: the message memo
hits), warm (a message not seen before whose words were, as common words are in steady
traffic: the message memo emptied before every call) and cold (both memos emptied before
every call, every word and pair hashed afresh). ``--tools N`` gives the request N tools of ~600
bytes of JSON each (an agent's), whose size counts in ``prompt_tokens``. ``--choices`` ends
the message with four lettered answer options of ~130 characters each, alike ones (a
multiple-choice question: the ngram classifier's options term reads them on a message's
first sight, so the warm and cold rows pay for it).

With ``--embedding`` (needs ``pip install 'switchyard[embeddings]'``) it also times the
``embedding`` classifier's whole decision, against ``--index FILE`` (from ``route fit
--classifier embedding``) or, without one, an index of 8,000 generated prompts with random
labels (the cost depends on the index's size, not on its content): warm (the prompt's
words embedded before) and cold (the word memo emptied before every call).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from gateway.config import parse_policy
from gateway.routing.features import extract
from gateway.routing.resolve import Router

PROSE = (
    "Our warehouse in Rotterdam ships about four thousand parcels a day, and since the new carrier "
    "contract started the share of late deliveries doubled. Why did this happen, and what should we "
    "change first? Compare the options and explain the trade-offs. "
)
CODE = "```python\ndef late(rows):\n    return [r for r in rows if r.eta > r.promised]\n```\n"

POLICY = """
deployments:
  a: {base_url: "http://127.0.0.1:1/v1"}
  b: {base_url: "http://127.0.0.1:1/v1"}
tiers: {fast: [a], strong: [b]}
routing:
  rules: [{name: long_context, when: {prompt_tokens: {gt: 16000}}, tier: strong}]
  classifier:
    name: linear
    bias: -1.65
    weights: {prompt_tokens: 1.57, last_user_chars: 1.67, code_density: 0.74, math_density: 0.29,
              reasoning_cues: 3.35, questions: -0.38, non_ascii_share: 0.53}
"""
NGRAM_POLICY = POLICY.split("  classifier:")[0] + "  classifier: {name: ngram}\n"
WORDS = (PROSE + " prove the integral of x derive a recursive function for the tree compare essays").split()


def generated_index(path: Path, size: int) -> None:
    """An index of ``size`` generated prompts with random labels, for timing only."""
    from gateway.routing.features import extract as features_of
    from gateway.routing.learn.embedding_fit import fit_index
    from gateway.routing.static_embedder import load

    rng = random.Random(7)
    rows = [
        {"prompt": " ".join(rng.choices(WORDS, k=rng.randint(5, 120))), "weak": rng.randint(0, 1)}
        for _ in range(size)
    ]
    for row in rows:
        row["strong"] = 1
    features = [features_of({"prompt": row["prompt"]}) for row in rows]
    fit_index(rows, features, load()).dump(path)


def time_embedding(body: dict[str, object], index: str | None, runs: int) -> None:
    """The embedding classifier's decision, warm and cold."""
    if index is None:
        index = str(Path(tempfile.mkdtemp()) / "generated.npz")
        generated_index(Path(index), 8000)
    policy = POLICY.split("  classifier:")[0] + f"  classifier: {{name: embedding, index_file: '{index}'}}\n"
    router = Router(parse_policy(policy, "bench"))
    clf = router.classifier
    memo = clf.embedder._memo  # type: ignore[union-attr]
    # The ngram part's message memo is emptied in both: a new message, its words seen before
    # (warm) or not (cold), as these two rows measured before that memo existed.
    ngram = clf.ngram  # type: ignore[union-attr]
    texts: dict[str, float] = ngram._texts if ngram is not None else {}  # None with combine: length

    def warm() -> None:
        texts.clear()
        router.resolve(body)

    def cold() -> None:
        texts.clear()
        memo.clear()
        router.resolve(body)

    timed(warm, 200)
    w50, w99 = timed(warm, runs)
    c50, c99 = timed(cold, runs)
    size = len(clf.index.gains)  # type: ignore[union-attr]
    print(f"routing, embedding (warm): median {w50:6.1f} us   p99 {w99:6.1f} us   ({size} prompts indexed)")
    print(f"routing, embedding (cold): median {c50:6.1f} us   p99 {c99:6.1f} us   (every word tokenized)")


CHOICES = "".join(
    f"\n{letter}. The carrier contract changed the cut-off time for parcels to {hour} p.m., so the "
    "late share doubled at the Rotterdam warehouse after the change"
    for letter, hour in zip("ABCD", (4, 5, 6, 7), strict=True)
)


def body_of(tokens: int, tools: int = 0, choices: bool = False) -> dict[str, object]:
    text = CODE
    while len(text) < tokens * 4:
        text += PROSE
    tail = CHOICES if choices else ""
    text = text[: tokens * 4 - len(tail)] + tail
    body: dict[str, object] = {
        "model": "auto",
        "messages": [
            {"role": "system", "content": "You are an operations analyst."},
            {"role": "user", "content": text},
        ],
        "max_tokens": 512,
    }
    if tools:
        body["tools"] = [tool_of(n) for n in range(tools)]
    return body


def tool_of(n: int) -> dict[str, object]:
    """An agent's tool of ~600 bytes of JSON: a description and four documented parameters."""
    parameters = {
        f"arg_{k}": {"type": "string", "description": f"value {k} of the call, relative to the workspace"}
        for k in range(4)
    }
    return {
        "type": "function",
        "function": {
            "name": f"tool_{n}",
            "description": f"Does step {n} of a change in the workspace and reports what it did.",
            "parameters": {"type": "object", "properties": parameters, "required": ["arg_0"]},
        },
    }


def timed(fn: object, runs: int) -> tuple[float, float]:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        samples.append((time.perf_counter() - t0) * 1e6)
    samples.sort()
    return statistics.median(samples), samples[int(0.99 * len(samples))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=8000)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--embedding", action="store_true", help="time the embedding classifier too")
    parser.add_argument("--index", help="with --embedding: an index file (default: 8,000 generated prompts)")
    parser.add_argument("--tools", type=int, default=0, help="give the request this many tools (an agent's)")
    parser.add_argument("--choices", action="store_true", help="end the message with four answer options")
    args = parser.parse_args()
    body = body_of(args.tokens, args.tools, args.choices)
    router = Router(parse_policy(POLICY, "bench"))
    for fn in (lambda: extract(body), lambda: router.resolve(body)):
        timed(fn, 200)
    f50, f99 = timed(lambda: extract(body), args.runs)
    r50, r99 = timed(lambda: router.resolve(body), args.runs)
    ngram = Router(parse_policy(NGRAM_POLICY, "bench"))
    memo = ngram.classifier._memo  # type: ignore[union-attr]
    texts = ngram.classifier._texts  # type: ignore[union-attr]
    timed(lambda: ngram.resolve(body), 200)
    s50, s99 = timed(lambda: ngram.resolve(body), args.runs)

    def warm() -> None:
        texts.clear()
        ngram.resolve(body)

    def cold() -> None:
        texts.clear()
        memo.clear()
        ngram.resolve(body)

    w50, w99 = timed(warm, args.runs)
    c50, c99 = timed(cold, args.runs)
    tools = f", {args.tools} tools" if args.tools else ""
    print(f"prompt of about {args.tokens} tokens ({args.tokens * 4} characters){tools}, {args.runs} runs")
    print(f"feature extraction      : median {f50:6.1f} us   p99 {f99:6.1f} us")
    print(
        f"routing, linear         : median {r50:6.1f} us   p99 {r99:6.1f} us   (rules, classifier, order too)"
    )
    print(f"routing, ngram (same)   : median {s50:6.1f} us   p99 {s99:6.1f} us   (the message seen before)")
    print(f"routing, ngram (warm)   : median {w50:6.1f} us   p99 {w99:6.1f} us   (its words seen before)")
    print(f"routing, ngram (cold)   : median {c50:6.1f} us   p99 {c99:6.1f} us   (every word hashed again)")
    if args.embedding:
        time_embedding(body, args.index, args.runs)


if __name__ == "__main__":
    main()
