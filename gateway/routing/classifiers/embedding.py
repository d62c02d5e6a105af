"""The ``embedding`` classifier: the nearest labelled prompts, by static sentence embeddings.

Opt-in (the default classifier is ``ngram``). A request's text (``Features.text``: the last
user message, or its first and last 600 characters when longer) is embedded by
:mod:`gateway.routing.static_embedder` (WordLlama's 256-d token table, mean pooled, from
the files in its wheel; ``pip install 'switchyard[embeddings]'``), centred on the index's
mean and compared by cosine with every prompt of a fitted index. The mean gain of the
strong call among the ``neighbours`` most similar prompts (1: only strong was right, 0.5:
both or neither, 0: only weak) is z-scored with the index's own statistics and combined:

- ``combine: ngram`` (the default fit): the ``ngram`` classifier's logit plus
  ``knn_weight`` x the neighbours' z-score (scaled to the ngram logit's spread), so the
  neighbours shift what the words and length say;
- ``combine: length``: ``knn_weight`` x the neighbours' z-score plus ``length_weight`` x
  the z-scored log length, as ``ngram``'s length term.

The index (``switchyard route fit --classifier embedding FILE``) is the user's own labelled
prompts: their vectors, gains and a short reference each (the row's ``id`` and first
words) that ``route explain`` shows. None ships: an ``embedding`` policy names its index.

numpy and the model are imported and loaded when a policy that uses this classifier is
built, once per process; importing this module costs nothing.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from gateway.routing.classifiers import Classifier, ClassifierSettings, Neighbour, register
from gateway.routing.features import Features
from gateway.validation import policy_file

if TYPE_CHECKING:
    import numpy as np

    from gateway.routing.classifiers.ngram import Ngram
    from gateway.routing.static_embedder import StaticEmbedder

FORMAT = "switchyard-embedding-index/1"
Combine = Literal["ngram", "length"]


class EmbeddingSettings(ClassifierSettings):
    """``embedding``: nearest neighbours in ``index_file`` (written by ``switchyard route fit
    --classifier embedding``); the other fields override what the fit chose."""

    name: Literal["embedding"] = "embedding"
    index_file: str = Field(
        description="The index written by `switchyard route fit --classifier embedding FILE`."
    )
    neighbours: int | None = Field(
        None, ge=1, description="How many nearest prompts vote (default: the fit's)."
    )
    knn_weight: float | None = Field(None, description="The neighbours' weight (default: the fit's).")
    ngram_weights_file: str | None = Field(
        None, description="With combine ngram: the ngram weights (default: the shipped ones)."
    )

    @field_validator("ngram_weights_file")
    @classmethod
    def _beside_the_policy(cls, path: str | None) -> str | None:
        return None if path is None else policy_file(path)

    @field_validator("index_file")
    @classmethod
    def _usable(cls, path: str) -> str:
        # Both checks at policy load, so a missing extra or a bad file never surfaces per request.
        from gateway.routing.static_embedder import EmbeddingUnavailable, model_files

        try:
            model_files()
        except EmbeddingUnavailable as exc:
            raise ValueError(str(exc)) from None
        path = policy_file(path)
        try:
            EmbeddingIndex.load(Path(path))
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(f"cannot read the index: {exc}") from None
        return path


@dataclass(frozen=True, slots=True)
class EmbeddingIndex:
    """Fitted numbers and the labelled prompts' vectors (centred, unit length)."""

    vectors: np.ndarray
    """One row per prompt, float32."""
    gains: np.ndarray
    """Each prompt's target in [0, 1] (1: strong needed, 0.5: either, 0: weak better)."""
    refs: list[str]
    """Each prompt's ``id`` and first words, for ``route explain``."""
    mean: np.ndarray
    """The raw embeddings' mean, subtracted before comparing (the common direction of mean
    pooled static embeddings would otherwise dominate every cosine)."""
    about: dict[str, Any]
    """The fitted constants: neighbours, knn_weight, combine, knn_mean, knn_std, length_mean,
    length_std, length_weight, ngram_scale, the embedder, examples."""

    def dump(self, path: Path) -> None:
        """Write an ``.npz`` (vectors as float16: half the size, the same neighbours)."""
        import numpy as np

        with path.open("wb") as f:
            np.savez_compressed(
                f,
                vectors=self.vectors.astype(np.float16),
                gains=self.gains.astype(np.float32),
                refs=np.asarray(self.refs, dtype=str),
                mean=self.mean.astype(np.float32),
                about=np.asarray(json.dumps({"format": FORMAT, **self.about})),
            )

    @classmethod
    def load(cls, path: Path) -> EmbeddingIndex:
        """Read a file :meth:`dump` wrote."""
        from gateway.routing.static_embedder import single_threaded_blas

        single_threaded_blas()  # before numpy's first import, which may be this one
        import numpy as np

        with np.load(path, allow_pickle=False) as data:
            about = json.loads(str(data["about"]))
            if about.pop("format", None) != FORMAT:
                raise ValueError(f"{path}: not a {FORMAT} file")
            vectors = np.ascontiguousarray(data["vectors"], dtype=np.float32)
            gains = np.asarray(data["gains"], dtype=np.float32)
            refs = [str(r) for r in data["refs"]]
            mean = np.asarray(data["mean"], dtype=np.float32)
        if not (len(vectors) == len(gains) == len(refs)) or vectors.shape[1:] != mean.shape:
            raise ValueError(f"{path}: malformed index")
        return cls(vectors, gains, refs, mean, about)

    def project(self, raw: np.ndarray) -> np.ndarray:
        """A raw embedding centred on the index's mean, at unit length."""
        import numpy as np

        centred: np.ndarray = raw - self.mean
        norm = float(np.linalg.norm(centred))
        return centred / norm if norm > 0 else centred


@register(EmbeddingSettings)
class Embedding(Classifier):
    """k nearest labelled prompts by cosine of static embeddings, combined with ngram or length."""

    def __init__(
        self,
        settings: EmbeddingSettings | EmbeddingIndex,
        embedder: StaticEmbedder | None = None,
        ngram: Ngram | None = None,
    ) -> None:
        from gateway.routing.static_embedder import load

        if isinstance(settings, EmbeddingIndex):
            index, overrides = settings, None
        else:
            index, overrides = EmbeddingIndex.load(Path(settings.index_file)), settings
        about = index.about
        self.index = index
        self.embedder = embedder if embedder is not None else load()
        self.neighbours = min(
            len(index.gains), (overrides and overrides.neighbours) or int(about["neighbours"])
        )
        weight = overrides.knn_weight if overrides is not None else None
        self.knn_weight = float(about["knn_weight"] if weight is None else weight)
        self.combine: Combine = about["combine"]
        self.ngram = ngram
        if self.combine == "ngram" and ngram is None:
            from gateway.routing.classifiers.ngram import Ngram, NgramSettings

            path = overrides.ngram_weights_file if overrides is not None else None
            self.ngram = Ngram(NgramSettings(weights_file=path))

    def nearest(self, text: str, ranked: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """The indices of the prompts nearest to ``text`` and their cosine similarities,
        most similar first (in no order unless ``ranked``: the vote does not need it)."""
        import numpy as np

        query = self.index.project(self.embedder.embed(text))
        sims = self.index.vectors @ query
        k = self.neighbours
        near = np.argpartition(sims, -k)[-k:] if k < len(sims) else np.arange(len(sims))
        if ranked:
            near = near[np.argsort(-sims[near])]
        return near, sims[near]

    def parts(self, features: Features) -> dict[str, float]:
        """The logit's parts: the neighbours' term and the ngram's logit or the length term."""
        about = self.index.about
        near, _ = self.nearest(features.text, ranked=False)
        knn = float(self.index.gains[near].mean())
        knn_z = (knn - float(about["knn_mean"])) / (float(about["knn_std"]) or 1.0)
        if self.combine == "ngram" and self.ngram is not None:
            scale = float(about["ngram_scale"])
            return {"neighbours": self.knn_weight * scale * knn_z, "ngram": self.ngram.logit(features)}
        length_z = (math.log1p(features.last_user_chars) - float(about["length_mean"])) / (
            float(about["length_std"]) or 1.0
        )
        return {"neighbours": self.knn_weight * knn_z, "length": float(about["length_weight"]) * length_z}

    def strong_probability(self, features: Features) -> float:
        z = sum(self.parts(features).values())
        return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))

    def explain(self, features: Features) -> list[tuple[str, float]]:
        """The neighbours' term, then the ngram's logit (or the length term)."""
        return sorted(self.parts(features).items(), key=lambda kv: -abs(kv[1]))

    def neighbours_of(self, features: Features) -> list[Neighbour]:
        """The labelled prompts that voted, most similar first."""
        near, sims = self.nearest(features.text)
        return [
            Neighbour(self.index.refs[i], float(s), float(self.index.gains[i]))
            for i, s in zip(near.tolist(), sims.tolist(), strict=True)
        ]
