"""The collector settings a serving process runs with (issue #20: CPU per request flat
across concurrency)."""

from __future__ import annotations

import gc

from gateway.http.serve import GC_GEN0_THRESHOLD, tune_gc


def test_tune_gc_freezes_start_up_objects_and_collects_the_young_generation_rarely() -> None:
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_freeze_count() > 0
        gen0, gen1, gen2 = gc.get_threshold()
        assert gen0 == GC_GEN0_THRESHOLD
        assert (gen1, gen2) == before[1:]  # the older generations keep CPython's ratios
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
