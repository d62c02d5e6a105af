"""Switchyard's benchmarks. ``python -m bench`` lists the scenarios and runs one
(``python -m bench overhead --full``); ``bench/README.md`` says what each measures and holds
the current results, generated from ``bench/recorded/`` by ``python -m bench report-results``.

The scripts stay runnable by path (``bash bench/overhead.sh``, ``python bench/shaping.py``):
the entry point only finds them and passes the arguments through.
"""
