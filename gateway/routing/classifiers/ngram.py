"""The ``ngram`` classifier: what the prompt asks, as hashed word n-grams, plus its length.

Logistic regression over (a) the word unigrams and bigrams of ``Features.text`` — the last
user message, or its first and last 600 characters when longer, and of those at most the
first and last 80 words, so an 8k-token prompt costs what a 300-token one does — each
hashed with CRC-32 and weighted from a fitted table, their sum scaled by 1/sqrt(count);
(b) a fixed weight on the log of the last user message's length; (c) for a multiple-choice
question, a fixed weight on how alike its answer options are
(:func:`~gateway.routing.features.options_similarity`); and (d) optionally, the normalized
shape features the ``linear`` classifier reads (the shipped weights use none).
The table ships in the package (``ngram_weights.json``, fitted by ``switchyard route fit
--classifier ngram``) and holds hashes and weights only, no words. Words are lowercased,
digits folded to ``0`` (numbers count by their shape, not their value), punctuation splits
them.

The request path is pure Python: the weight of each word pair (with its second word's
folded in) is looked up once per process and memoized (a bounded dict), so a request costs
a translate, a split, one dict lookup per word and a sum; a message seen before (an agent's
task across the steps of its tool loop, a retry) costs one dict lookup (another bounded dict).
"""

from __future__ import annotations

import base64
import json
import math
import string
import sys
import zlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from gateway.routing.classifiers import Classifier, ClassifierSettings, register
from gateway.routing.features import FEATURE_NAMES, Features, options_similarity
from gateway.validation import policy_file

DEFAULT_WEIGHTS = Path(__file__).with_name("ngram_weights.json")
FORMAT = "switchyard-ngram/1"
# Digits fold to 0 (a number counts by its shape, not its value), punctuation splits words.
# Folded as UTF-8 bytes: the fold touches ASCII only and no byte of a multi-byte character is
# ASCII, so this is str.translate's result, at a table lookup per byte (2.5x faster).
_BYTE_FOLD = bytes.maketrans(
    ("0123456789" + string.punctuation).encode(), ("0" * 10 + " " * len(string.punctuation)).encode()
)
MAX_WORDS = 160
"""Words read from one message at most (the first and last 80): each costs a lookup, and the
held-out quality is the same with all of ``Features.text``'s 1,200 characters (about 200 words)."""
_HALF_WORDS = MAX_WORDS // 2
_MEMO_LIMIT = 100_000  # distinct word pairs remembered per classifier; about 15 MB at most
_TEXT_MEMO_LIMIT = 4_096  # distinct messages remembered (each at most 1,201 characters): ~6 MB

Key = str | tuple[str, str]


def words(text: str) -> list[str]:
    """The words the classifier reads: lowercased, digits folded to 0, split at spaces and
    punctuation; of a longer text, its first and last ``MAX_WORDS / 2``."""
    # surrogatepass: a lone surrogate passes through unchanged, as with str.translate
    folded = text.lower().encode("utf-8", "surrogatepass").translate(_BYTE_FOLD)
    tokens = folded.decode("utf-8", "surrogatepass").split()
    if len(tokens) > MAX_WORDS:
        return tokens[:_HALF_WORDS] + tokens[-_HALF_WORDS:]
    return tokens


def key_hash(key: Key) -> int:
    """The CRC-32 of a word, or of a pair of words joined by a space (stable across processes,
    unlike ``hash``)."""
    text = key if isinstance(key, str) else f"{key[0]} {key[1]}"
    return zlib.crc32(text.encode())


def keys(tokens: list[str]) -> Iterator[Key]:
    """Every unigram, then every bigram, of a word list."""
    yield from tokens
    yield from pairwise(tokens)


class NgramSettings(ClassifierSettings):
    """``ngram``: fitted weights from ``weights_file`` (default: the ones shipped in the package)."""

    name: Literal["ngram"] = "ngram"
    weights_file: str | None = Field(
        None, description="A weights file written by `switchyard route fit --classifier ngram`."
    )

    @field_validator("weights_file")
    @classmethod
    def _readable(cls, path: str | None) -> str | None:
        if path is not None:
            path = policy_file(path)
            try:
                NgramModel.load(Path(path))
            except (OSError, ValueError, KeyError) as exc:
                raise ValueError(f"cannot read the weights: {exc}") from None
        return path


@dataclass(frozen=True, slots=True)
class NgramModel:
    """Fitted numbers: the bias, a weight per shape feature, a weight per n-gram hash."""

    bias: float
    shape: dict[str, float]
    table: dict[int, float]
    about: dict[str, Any]
    length_weight: float = 0.0
    length_center: float = 0.0
    options_weight: float = 0.0
    options_center: float = 0.0

    def length_logit(self, last_user_chars: int) -> float:
        """The prompt length's share of the logit."""
        return self.length_weight * (math.log1p(last_user_chars) - self.length_center)

    def options_logit(self, text: str) -> float:
        """The answer options' share of the logit: 0 for a text that lists none."""
        if not self.options_weight:
            return 0.0
        similarity = options_similarity(text)
        return 0.0 if similarity is None else self.options_weight * (similarity - self.options_center)

    def dump(self, path: Path) -> None:
        """Write the model as JSON (hashes and weights packed as base64 little-endian arrays)."""
        hashes = array("I", sorted(self.table))
        scale = max((abs(w) for w in self.table.values()), default=1.0) / 32767 or 1.0
        weights = array("h", [round(self.table[h] / scale) for h in hashes])
        if sys.byteorder == "big":
            hashes.byteswap()
            weights.byteswap()
        doc = {
            "format": FORMAT,
            "about": self.about,
            "bias": round(self.bias, 6),
            "length_weight": self.length_weight,
            "length_center": self.length_center,
            "options_weight": self.options_weight,
            "options_center": self.options_center,
            "shape": {k: round(v, 6) for k, v in self.shape.items()},
            "weight_scale": scale,
            "hashes": base64.b64encode(hashes.tobytes()).decode(),
            "weights": base64.b64encode(weights.tobytes()).decode(),
        }
        path.write_text(json.dumps(doc, indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> NgramModel:
        """Read a file :meth:`dump` wrote."""
        doc = json.loads(path.read_text())
        if doc.get("format") != FORMAT:
            raise ValueError(f"{path}: not a {FORMAT} weights file")
        hashes = array("I", base64.b64decode(doc["hashes"]))
        weights = array("h", base64.b64decode(doc["weights"]))
        if sys.byteorder == "big":
            hashes.byteswap()
            weights.byteswap()
        scale = float(doc["weight_scale"])
        unknown = [k for k in doc["shape"] if k not in FEATURE_NAMES]
        if unknown or len(hashes) != len(weights):
            raise ValueError(f"{path}: malformed weights (unknown features {unknown})")
        table = {h: w * scale for h, w in zip(hashes, weights, strict=True)}
        return cls(
            bias=float(doc["bias"]),
            shape=dict(doc["shape"]),
            table=table,
            about=dict(doc.get("about", {})),
            length_weight=float(doc.get("length_weight", 0.0)),
            length_center=float(doc.get("length_center", 0.0)),
            options_weight=float(doc.get("options_weight", 0.0)),
            options_center=float(doc.get("options_center", 0.0)),
        )


class _Memo(dict[tuple[str, str], float]):
    """Word pair -> the pair's weight plus its second word's, filled on first sight (C-speed
    lookups after that). Folding the second word's unigram into its pair halves the lookups
    per request: a message's n-grams are its first word and then one entry per pair."""

    def __init__(self, table: dict[int, float]) -> None:
        super().__init__()
        self.table = table

    def __missing__(self, pair: tuple[str, str]) -> float:
        table = self.table
        weight = self[pair] = table.get(key_hash(pair), 0.0) + table.get(key_hash(pair[1]), 0.0)
        return weight


@register(NgramSettings)
class Ngram(Classifier):
    """Logistic regression over hashed word n-grams and the shape features."""

    def __init__(self, settings: NgramSettings | NgramModel) -> None:
        if isinstance(settings, NgramModel):
            model = settings
        else:
            path = Path(settings.weights_file) if settings.weights_file else DEFAULT_WEIGHTS
            model = NgramModel.load(path)
        self.model = model
        self._memo = _Memo(model.table)
        # Features.text -> its n-grams' logit. An agent sends the same last user message with
        # every step of its tool loop, and a retried or hedged request sends it again.
        self._texts: dict[str, float] = {}
        # Only the shape weights read the text features (through Features.vector).
        self.reads_text_features = bool(model.shape)

    def ngram_logit(self, tokens: list[str]) -> float:
        """The n-grams' share of the logit."""
        if not tokens:
            return 0.0
        memo = self._memo
        if len(memo) > _MEMO_LIMIT:
            memo.clear()
        first = self.model.table.get(key_hash(tokens[0]), 0.0)
        # a miss hashes the pair and its second word once (_Memo.__missing__)
        total = first + sum(map(memo.__getitem__, pairwise(tokens)))
        return total / math.sqrt(2 * len(tokens) - 1)

    def text_logit(self, text: str) -> float:
        """:meth:`ngram_logit` of ``text``'s words plus its answer options' term, remembered
        per message (a bounded dict)."""
        texts = self._texts
        logit = texts.get(text)
        if logit is None:
            if len(texts) >= _TEXT_MEMO_LIMIT:
                texts.clear()
            logit = texts[text] = self.ngram_logit(words(text)) + self.model.options_logit(text)
        return logit

    def logit(self, features: Features) -> float:
        """The score before the logistic function: the bias and every term."""
        model = self.model
        z = model.bias + self.text_logit(features.text) + model.length_logit(features.last_user_chars)
        if model.shape:
            vector = features.vector()
            z += sum(weight * vector[name] for name, weight in model.shape.items())
        return z

    def strong_probability(self, features: Features) -> float:
        return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, self.logit(features)))))

    def explain(self, features: Features) -> list[tuple[str, float]]:
        """The bias, the shape features, then each word or pair's share of the logit (the
        words are read from this request: the table holds only their hashes)."""
        tokens = words(features.text)
        n = max(1, 2 * len(tokens) - 1)
        parts: dict[str, float] = {}
        for key in keys(tokens):
            weight = self.model.table.get(key_hash(key), 0.0)
            if weight:
                label = repr(key) if isinstance(key, str) else repr(f"{key[0]} {key[1]}")
                parts[label] = parts.get(label, 0.0) + weight / math.sqrt(n)
        vector = features.vector()
        for name, weight in self.model.shape.items():
            if weight * vector[name]:
                parts[name] = weight * vector[name]
        parts["length"] = self.model.length_logit(features.last_user_chars)
        options = self.model.options_logit(features.text)
        if options:
            parts["options alike"] = options
        ranked = sorted(parts.items(), key=lambda kv: -abs(kv[1]))
        return [("bias", self.model.bias), *ranked]
