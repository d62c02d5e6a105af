"""The file of ``switchyard local serve CONFIG.yaml``: a YAML mapping of launch knobs."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from gateway.replicas.launch import VllmLaunch
from gateway.replicas.launch_plan import LaunchError


def load_launch_file(path: str) -> VllmLaunch:
    """Read a ``switchyard local serve`` config: a YAML mapping of :class:`VllmLaunch` knobs.

    Raises :class:`LaunchError` with every problem, each with its key path.
    """
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise LaunchError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise LaunchError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise LaunchError(f"{path}: a launch config is a YAML mapping of vLLM knobs")
    try:
        launch = VllmLaunch.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            message = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            lines.append(f"{path}: {where}: {message.removeprefix('Value error, ')}")
        raise LaunchError("\n".join(lines)) from None
    if not launch.model:
        raise LaunchError(f"{path}: model: required (the model vLLM loads: a Hugging Face id or a path)")
    return launch
