"""Sentence vectors from a static embedding table: token lookup and mean pooling, numpy only.

The table and its tokenizer are WordLlama's (``l2_supercat``: the Llama-2 tokenizer's 32,000
tokens, 256 dimensions, float16), read from the files its wheel ships. The ``wordllama``
package itself is never imported: its import configures the root logger, and its loader
falls back to downloading from a model hub; here the files are located with
:func:`importlib.util.find_spec` and read directly, so nothing is ever downloaded.

A text's vector is the mean of its tokens' rows, normalized to unit length. The tokenizer
has no pre-tokenizer (SentencePiece style: spaces become ``▁``, and no token but a run of
``▁`` has one after its first character), so tokenizing word by word gives the same tokens
as the whole text (measured: identical on 79 of 86 training prompts, cosine 0.9999 on
average, the rest differing at runs of spaces); each word's tokens are memoized per
process (a bounded dict), so a request costs a split, one lookup per word, one gather and
one sum, not a tokenizer run. (The mean's length does not matter: only the direction is
kept.)

The heavy imports (numpy, ``tokenizers``) happen in :func:`load`, on first use.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

PACKAGE = "wordllama"
EXTRA = "embeddings"
INSTALL_HINT = f"pip install 'switchyard[{EXTRA}]'"
TOKENIZER_FILE = "tokenizers/l2_supercat_tokenizer_config.json"
WEIGHTS_FILE = "weights/l2_supercat_256.safetensors"
TENSOR = "embedding.weight"
_MEMO_LIMIT = 200_000  # distinct words remembered per process (about 40 MB at most)


def single_threaded_blas() -> None:
    """Ask numpy's BLAS for one thread, if numpy is not imported yet (the variables are read
    once, at its import). The one product per request is small: a second BLAS thread saves
    about 0.1 ms on an idle machine, but spins for a busy core on a loaded one (a 6 ms
    median measured on the 2-core development machine, against 0.3 ms with one thread)."""
    if "numpy" not in sys.modules:
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, "1")


class EmbeddingUnavailable(RuntimeError):
    """The embedding model cannot be loaded (the optional extra is not installed)."""


def model_files() -> tuple[Path, Path]:
    """The tokenizer and weights files inside the installed ``wordllama`` wheel, found without
    importing it. Raises :class:`EmbeddingUnavailable` with the install line when absent."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddingUnavailable(f"the embedding classifier needs the `{PACKAGE}` package: {INSTALL_HINT}")
    root = Path(next(iter(spec.submodule_search_locations)))
    tokenizer, weights = root / TOKENIZER_FILE, root / WEIGHTS_FILE
    for path in (tokenizer, weights):
        if not path.is_file():
            raise EmbeddingUnavailable(
                f"{path} is missing from the installed `{PACKAGE}` ({INSTALL_HINT} installs one that has it)"
            )
    return tokenizer, weights


def _read_safetensors(path: Path, name: str) -> np.ndarray:
    """One tensor of a safetensors file (an 8-byte header length, a JSON header, raw data)."""
    import json

    import numpy as np

    dtypes = {"F16": np.float16, "F32": np.float32, "BF16": None}
    with path.open("rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        entry = header[name]
        dtype = dtypes.get(entry["dtype"])
        if dtype is None:
            raise EmbeddingUnavailable(f"{path}: unsupported dtype {entry['dtype']}")
        start, end = entry["data_offsets"]
        f.seek(8 + size + start)
        data = f.read(end - start)
    return np.frombuffer(data, dtype=dtype).reshape(entry["shape"]).astype(np.float32)


@dataclass(slots=True)
class StaticEmbedder:
    """Text -> unit vector (float32) by mean pooling a static token table."""

    table: np.ndarray
    tokenizer: Any
    _memo: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def dimensions(self) -> int:
        """The vector's length."""
        return int(self.table.shape[1])

    def token_ids(self, text: str) -> list[int]:
        """The text's tokens, each word's looked up in the memo (tokenized on first sight)."""
        memo = self._memo
        if len(memo) > _MEMO_LIMIT:
            memo.clear()
        # split(" ") and not split(): newlines are tokens too, and only spaces separate words
        words = text.split(" ")
        try:
            return list(chain.from_iterable(map(memo.__getitem__, words)))
        except KeyError:
            encode = self.tokenizer.encode
            for word in words:
                if word not in memo:
                    # the normalizer prepends "▁", as the space before the word does in the text
                    memo[word] = tuple(encode(word, add_special_tokens=False).ids) if word else ()
            return list(chain.from_iterable(map(memo.__getitem__, words)))

    def embed(self, text: str) -> np.ndarray:
        """The unit vector of a text (zeros for an empty one)."""
        import numpy as np

        ids = self.token_ids(text)
        if not ids:
            return np.zeros(self.table.shape[1], dtype=np.float32)
        # one gather and one sum in C: a Python loop over words would cost a microsecond each
        total = self.table.take(ids, axis=0).sum(axis=0)
        norm = float(np.linalg.norm(total))
        return total / norm if norm > 0 else total  # type: ignore[no-any-return]

    def embed_many(self, texts: list[str]) -> np.ndarray:
        """One row per text."""
        import numpy as np

        out = np.zeros((len(texts), self.table.shape[1]), dtype=np.float32)
        for i, text in enumerate(texts):
            out[i] = self.embed(text)
        return out


_loaded: StaticEmbedder | None = None
_lock = threading.Lock()


def load() -> StaticEmbedder:
    """The process's embedder, loaded on first call (about 0.2 s; 33 MB of float32) and shared
    by every policy that uses it. Raises :class:`EmbeddingUnavailable` without the extra."""
    global _loaded
    # found every time (cheap), so a missing extra is reported the same way whatever ran before
    tokenizer_file, weights_file = model_files()
    single_threaded_blas()
    with _lock:
        if _loaded is None:
            # belt and braces: nothing below may reach a model hub
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            try:
                # imported by name: mypy must pass where the extra is not installed
                tokenizers = importlib.import_module("tokenizers")
            except ImportError:
                raise EmbeddingUnavailable(
                    f"the embedding classifier needs the `tokenizers` package: {INSTALL_HINT}"
                ) from None
            tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_file))
            tokenizer.no_padding()
            tokenizer.no_truncation()
            _loaded = StaticEmbedder(_read_safetensors(weights_file, TENSOR), tokenizer)
        return _loaded
