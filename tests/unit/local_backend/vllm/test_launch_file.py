"""The file of ``switchyard local serve CONFIG.yaml``: every problem named with its key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.replicas.launch_plan import LaunchError
from local_backend.vllm import load_launch_file


def test_launch_file_errors_name_the_key(tmp_path: Path) -> None:
    path = tmp_path / "launch.yaml"
    path.write_text("model: m\nmax_num_seqs: -1\nspeculative: {method: eagle}\ncolour: blue\n")
    with pytest.raises(LaunchError) as info:
        load_launch_file(str(path))
    text = str(info.value)
    assert f"{path}: max_num_seqs: Input should be greater than or equal to 1" in text
    assert f"{path}: speculative: speculative method 'eagle' needs a draft model" in text
    assert f"{path}: colour: unknown key" in text
    path.write_text("port: 9000\n")
    with pytest.raises(LaunchError, match="model: required"):
        load_launch_file(str(path))
