"""A head read against the last one of its template shape reads exactly as a full read."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.shaping.heads import HeadReader
from gateway.shaping.policy import DETECTORS
from gateway.shaping.volatile import Detectors
from tests.unit.shaping.test_units import _PIECES

_VALUES = ["10:42", "10:43", "2026-12-04", "Ana", "Bo Chen", "", "# Late", "- item", "<env>", "x:"]


def _reader(rag: bool) -> HeadReader:
    return HeadReader(Detectors(list(DETECTORS), []), [("<context>", "</context>")] if rag else None)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.sampled_from(_PIECES), min_size=1, max_size=14),
    st.lists(st.tuples(st.integers(0, 13), st.sampled_from(_VALUES)), max_size=3),
    st.lists(st.tuples(st.integers(0, 13), st.sampled_from(_VALUES)), max_size=3),
    st.booleans(),
)
def test_reading_against_the_last_head_gives_a_full_reads_answer(
    pieces: list[str],
    first: list[tuple[int, str]],
    second: list[tuple[int, str]],
    rag: bool,
) -> None:
    reader = _reader(rag)
    texts = []
    for changes in ([], first, second, first):
        lines = list(pieces)
        for at, value in changes:
            if at < len(lines):
                lines[at] = f"{lines[at]} {value}".strip() if value else ""
        texts.append("\n".join(lines))
    for text in texts:
        assert reader.read(text, "t") == _reader(rag).read(text, "t")
