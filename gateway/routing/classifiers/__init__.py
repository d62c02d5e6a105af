"""Classifiers behind one small interface, as RouteLLM's ``calculate_strong_win_rate``.

A classifier turns a request's :class:`~gateway.routing.features.Features` into the
probability that the strong tier is needed; the router compares it with the policy's
threshold. A new classifier is one module in this package: its settings model (a
:class:`ClassifierSettings` whose ``name`` is a literal), its :class:`Classifier`, and
``@register(TheSettings)`` on the class. The package finds its modules on first use, so
nothing else is edited; ``routing.classifier.name`` in a policy selects one (default
``linear``) and the rest of that block is validated by the classifier's own settings model.
A classifier that needs a heavy library imports it inside its constructor, never at the
top of its module: every module here is imported when a policy is validated.
"""

from __future__ import annotations

import importlib
import pkgutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler, ValidationError
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import InitErrorDetails, PydanticCustomError, core_schema

from gateway.routing.features import Features
from gateway.validation import StrictModel

DEFAULT_CLASSIFIER = "linear"


class ClassifierSettings(StrictModel):
    """The ``routing.classifier`` block; each classifier subclasses it with its own fields."""

    name: str


class Classifier(ABC):
    """The interface the router uses; built once per loaded policy from its settings."""

    reads_text_features = True
    """Whether :meth:`strong_probability` reads the text features (code and math density,
    reasoning cues, questions, non-ASCII share). A classifier that reads only
    ``Features.text`` and the body-shape features sets it False, and the router then
    leaves those five at 0 instead of computing them."""

    @abstractmethod
    def strong_probability(self, features: Features) -> float:
        """P(the strong tier is needed), in [0, 1]."""

    def explain(self, features: Features) -> list[tuple[str, float]]:
        """Labelled parts of the score for ``route explain``, most telling first (none by default)."""
        return []

    def neighbours_of(self, features: Features) -> list[Neighbour]:
        """The labelled prompts that drove the score, for ``route explain`` (none by default:
        only a nearest-neighbour classifier has them)."""
        return []


@dataclass(frozen=True, slots=True)
class Neighbour:
    """One labelled prompt that voted on a decision."""

    ref: str
    """Its ``id`` and first words."""
    similarity: float
    """Cosine similarity with the request, in [-1, 1]."""
    gain: float
    """Its target: 1 strong needed, 0.5 either, 0 weak better (or a score between)."""


@dataclass(frozen=True, slots=True)
class ClassifierType:
    """A registered classifier: its settings model and how to build it from them."""

    name: str
    settings: type[ClassifierSettings]
    build: Callable[[Any], Classifier]


CLASSIFIERS: dict[str, ClassifierType] = {}
"""Classifier name -> its registration (this package's modules are loaded on first lookup)."""

_C = TypeVar("_C", bound=type[Classifier])
_discovered = False


def register(settings: type[ClassifierSettings]) -> Callable[[_C], _C]:
    """Class decorator: the classifier built from ``settings``, named by its ``name`` default."""
    name = settings.model_fields["name"].default
    if not isinstance(name, str):
        raise TypeError(f"{settings.__name__}.name needs a default: the classifier's name")

    def add(cls: _C) -> _C:
        CLASSIFIERS[name] = ClassifierType(name, settings, cls)
        return cls

    return add


def registered() -> Mapping[str, ClassifierType]:
    """Every classifier known, the modules of this package included."""
    global _discovered
    if not _discovered:
        _discovered = True
        for module in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{module.name}")
    return CLASSIFIERS


def build(settings: ClassifierSettings) -> Classifier:
    """The classifier a validated ``routing.classifier`` block describes."""
    return registered()[settings.name].build(settings)


def validate_settings(data: Any) -> ClassifierSettings:
    """Validate a ``routing.classifier`` block with the settings model its ``name`` selects."""
    if isinstance(data, ClassifierSettings):
        return data
    if not isinstance(data, dict):
        raise PydanticCustomError("classifier_type", "a classifier is a mapping with a name")
    name = data.get("name", DEFAULT_CLASSIFIER)
    found = registered().get(name) if isinstance(name, str) else None
    if found is None:
        error = PydanticCustomError(
            "unknown_classifier",
            "unknown classifier {name!r} (known: {known})",
            {"name": name, "known": ", ".join(registered())},
        )
        raise ValidationError.from_exception_data(
            "ClassifierSettings", [InitErrorDetails(type=error, loc=("name",), input=name)]
        )
    return found.settings.model_validate(data)


class AnyClassifierSettings:
    """Annotation for the ``routing.classifier`` field: validated by name through the registry,
    exported to the JSON schema as any registered classifier's settings."""

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            validate_settings,
            serialization=core_schema.plain_serializer_function_ser_schema(
                _dump, info_arg=True, return_schema=core_schema.dict_schema()
            ),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        kinds = sorted(registered().values(), key=lambda kind: kind.name)
        return {"anyOf": [handler(kind.settings.__pydantic_core_schema__) for kind in kinds]}


def _dump(settings: ClassifierSettings, info: core_schema.SerializationInfo) -> dict[str, Any]:
    return settings.model_dump(mode=info.mode)
