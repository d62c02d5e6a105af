"""A launched model's own chat template says which placement it renders (read offline)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.shaping.chat_template import render_placement

pytest.importorskip("jinja2")

ANYWHERE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] or '' }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# Raises on a system message that is not first (as many models' templates do).
FIRST_ONLY = (
    "{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('System role only at the start') }}{% endif %}"
    "[{{ m['role'] }}] {{ m['content'] or '' }}\n{% endfor %}"
)
# Renders the first system message and silently drops any other.
DROPS_LATE = (
    "{% for m in messages %}{% if m['role'] != 'system' or loop.first %}"
    "[{{ m['role'] }}] {{ m['content'] or '' }}\n{% endif %}{% endfor %}"
)
# Roles must alternate after the system message: a system message between turns raises.
ALTERNATING = (
    "{% set rest = messages[1:] if messages[0]['role'] == 'system' else messages %}"
    "{% for m in rest %}{% if m['role'] == 'system' %}{{ raise_exception('roles must alternate') }}"
    "{% endif %}{% if m['role'] == 'user' and loop.last == false and rest[loop.index0 + 1]['role'] == 'user' %}"
    "{{ raise_exception('roles must alternate') }}{% endif %}{{ m['role'] }}: {{ m['content'] or '' }}\n{% endfor %}"
)


def model_dir(tmp_path: Path, template: str, as_file: bool = False) -> Path:
    config = {"bos_token": {"content": "<s>"}, "eos_token": "</s>"}
    if as_file:
        (tmp_path / "chat_template.jinja").write_text(template)
    else:
        config["chat_template"] = template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def test_a_template_that_renders_a_system_message_anywhere_gets_the_latest(tmp_path: Path) -> None:
    assert render_placement(model_dir(tmp_path, ANYWHERE)) == "after_last_turn"


def test_a_template_that_raises_on_a_late_system_message_keeps_it_in_the_first(tmp_path: Path) -> None:
    assert render_placement(model_dir(tmp_path, FIRST_ONLY)) == "end_of_system"
    alternating = tmp_path / "alternating"
    alternating.mkdir()
    assert render_placement(model_dir(alternating, ALTERNATING)) == "end_of_system"


def test_a_template_that_drops_a_late_system_message_never_gets_one(tmp_path: Path) -> None:
    assert render_placement(model_dir(tmp_path, DROPS_LATE)) == "end_of_system"


def test_the_template_file_and_named_templates_are_read(tmp_path: Path) -> None:
    assert render_placement(model_dir(tmp_path, ANYWHERE, as_file=True)) == "after_last_turn"
    named = tmp_path / "named"
    named.mkdir()
    (named / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": [
                    {"name": "tool_use", "template": ANYWHERE},
                    {"name": "default", "template": FIRST_ONLY},
                ]
            }
        )
    )
    assert render_placement(named) == "end_of_system"  # vLLM renders the default one
    assert render_placement(tmp_path / "missing") is None
