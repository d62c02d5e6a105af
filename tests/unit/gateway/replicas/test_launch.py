"""The launch knobs: each maps to vLLM's flag, contradictions are refused before launch."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.replicas.launch import FLAG_OF_KNOB, VllmLaunch, knob_of_flag
from gateway.replicas.launch_plan import LaunchError, plan_replicas


def argv_of(environ: dict[str, str] | None = None, **knobs: Any) -> list[str]:
    plans = plan_replicas(VllmLaunch(model="org/model-7b", **knobs), "d", environ or {})
    return list(plans[0].argv)


def flag_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def error_of(**knobs: Any) -> str:
    with pytest.raises(ValidationError) as info:
        VllmLaunch(model="m", **knobs)
    return str(info.value)


def test_defaults_serve_the_model_with_prefix_caching_and_cached_token_details() -> None:
    argv = argv_of()
    assert argv[:3] == ["vllm", "serve", "org/model-7b"]
    assert flag_value(argv, "--host") == "127.0.0.1"
    assert flag_value(argv, "--port") == "8001"
    assert flag_value(argv, "--served-model-name") == "org/model-7b"
    assert "--enable-prefix-caching" in argv
    assert "--enable-prompt-tokens-details" in argv
    # Nothing we did not ask for: vLLM's own defaults apply.
    for flag in ("--max-num-seqs", "--gpu-memory-utilization", "--tensor-parallel-size", "--quantization"):
        assert flag not in argv


def test_every_knob_maps_to_its_vllm_flag() -> None:
    argv = argv_of(
        served_model_name="fast",
        max_num_seqs=64,
        max_num_batched_tokens=8192,
        gpu_memory_utilization=0.85,
        max_model_len=16384,
        quantization="awq",
        kv_cache_dtype="fp8",
        calculate_kv_scales=True,
        dtype="bfloat16",
        block_size=16,
        seed=7,
        tensor_parallel_size=2,
        pipeline_parallel_size=2,
        enable_chunked_prefill=True,
        enforce_eager=True,
        trust_remote_code=True,
        gpus=[0, 1, 2, 3],
    )
    expected = {
        "--served-model-name": "fast",
        "--max-num-seqs": "64",
        "--max-num-batched-tokens": "8192",
        "--gpu-memory-utilization": "0.85",
        "--max-model-len": "16384",
        "--quantization": "awq",
        "--kv-cache-dtype": "fp8",
        "--dtype": "bfloat16",
        "--block-size": "16",
        "--seed": "7",
        "--tensor-parallel-size": "2",
        "--pipeline-parallel-size": "2",
    }
    for flag, value in expected.items():
        assert flag_value(argv, flag) == value, flag
    for flag in (
        "--calculate-kv-scales",
        "--enable-chunked-prefill",
        "--enforce-eager",
        "--trust-remote-code",
    ):
        assert flag in argv


def test_turning_defaults_off_uses_vllms_no_flags() -> None:
    argv = argv_of(
        enable_prefix_caching=False, enable_prompt_tokens_details=False, enable_chunked_prefill=False
    )
    assert "--no-enable-prefix-caching" in argv and "--enable-prefix-caching" not in argv
    assert "--no-enable-prompt-tokens-details" in argv
    assert "--no-enable-chunked-prefill" in argv


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
            {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
        ),
        (
            {"method": "eagle3", "model": "org/eagle3-head", "num_speculative_tokens": 3},
            {"method": "eagle3", "model": "org/eagle3-head", "num_speculative_tokens": 3},
        ),
        (
            {
                "method": "draft_model",
                "model": "org/tiny",
                "num_speculative_tokens": 4,
                "draft_tensor_parallel_size": 1,
            },
            {
                "method": "draft_model",
                "model": "org/tiny",
                "num_speculative_tokens": 4,
                "draft_tensor_parallel_size": 1,
            },
        ),
        ({"method": "mtp", "num_speculative_tokens": 1}, {"method": "mtp", "num_speculative_tokens": 1}),
    ],
)
def test_speculative_decoding_becomes_one_json_speculative_config(
    spec: dict[str, Any], expected: dict[str, Any]
) -> None:
    argv = argv_of(speculative=spec)
    assert json.loads(flag_value(argv, "--speculative-config")) == expected


def test_speculative_options_pass_through_into_the_json() -> None:
    argv = argv_of(speculative={"method": "mtp", "options": {"disable_padded_drafter_batch": True}})
    assert json.loads(flag_value(argv, "--speculative-config")) == {
        "method": "mtp",
        "disable_padded_drafter_batch": True,
    }


def test_unknown_extra_flags_pass_through_after_ours() -> None:
    extra = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--swap-space=8"]
    argv = argv_of(extra_args=extra)
    assert argv[-4:] == extra


def test_replicas_get_distinct_gpus_ports_and_urls() -> None:
    plans = plan_replicas(
        VllmLaunch(model="m", replicas=3, tensor_parallel_size=2, gpus=[7, 6, 5, 4, 3, 2], port=9000), "d", {}
    )
    assert [p.gpus for p in plans] == [("7", "6"), ("5", "4"), ("3", "2")]
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in plans] == ["7,6", "5,4", "3,2"]
    assert [p.port for p in plans] == [9000, 9001, 9002]
    assert [flag_value(list(p.argv), "--port") for p in plans] == ["9000", "9001", "9002"]
    assert [p.base_url for p in plans] == [f"http://127.0.0.1:{port}/v1" for port in (9000, 9001, 9002)]
    assert plans[1].health_url == "http://127.0.0.1:9001/health"


def test_replicas_stay_inside_the_gpus_the_gateway_was_given() -> None:
    plans = plan_replicas(VllmLaunch(model="m", replicas=2), "d", {"CUDA_VISIBLE_DEVICES": "4,5,6"})
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in plans] == ["4", "5"]
    with pytest.raises(LaunchError, match=r"4 GPUs needed .* offers 3: 4,5,6"):
        plan_replicas(
            VllmLaunch(model="m", replicas=2, tensor_parallel_size=2), "d", {"CUDA_VISIBLE_DEVICES": "4,5,6"}
        )


def test_without_a_gpu_list_replicas_take_gpus_from_zero() -> None:
    plans = plan_replicas(VllmLaunch(model="m", replicas=2, tensor_parallel_size=2), "d", {})
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in plans] == ["0,1", "2,3"]


def test_wildcard_bind_is_reached_on_loopback() -> None:
    plan = plan_replicas(VllmLaunch(model="m", host="0.0.0.0"), "d", {})[0]
    assert flag_value(list(plan.argv), "--host") == "0.0.0.0"
    assert plan.base_url == "http://127.0.0.1:8001/v1"


def test_api_key_goes_in_the_environment_never_on_the_command_line() -> None:
    plan = plan_replicas(VllmLaunch(model="m", api_key_env="MY_VLLM_KEY"), "d", {"MY_VLLM_KEY": "s3cret"})[0]
    assert plan.env["VLLM_API_KEY"] == "s3cret"
    assert not any("s3cret" in word for word in plan.argv)
    assert "s3cret" not in plan.command_line()
    with pytest.raises(LaunchError, match="MY_VLLM_KEY, which is not set"):
        plan_replicas(VllmLaunch(model="m", api_key_env="MY_VLLM_KEY"), "d", {})


def test_command_line_quotes_what_the_shell_needs() -> None:
    line = plan_replicas(VllmLaunch(model="m", speculative={"method": "mtp"}), "d", {}, gpu=True)[
        0
    ].command_line()
    assert line.startswith("CUDA_VISIBLE_DEVICES=0 vllm serve m ")
    assert """--speculative-config '{"method":"mtp"}'""" in line


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        (
            {"replicas": 3, "tensor_parallel_size": 2, "gpus": [0, 1, 2, 3]},
            "= 6 GPUs needed, but gpus lists 4",
        ),
        (
            {"replicas": 2, "pipeline_parallel_size": 2, "gpus": [0, 1, 2]},
            "= 4 GPUs needed, but gpus lists 3",
        ),
        ({"gpus": [0, 0]}, "lists a GPU twice"),
        ({"calculate_kv_scales": True}, "calculate_kv_scales only applies to an fp8 KV cache"),
        (
            {"kv_cache_dtype": "auto", "calculate_kv_scales": True},
            "calculate_kv_scales only applies to an fp8 KV cache",
        ),
        (
            {"max_num_seqs": 256, "max_num_batched_tokens": 128},
            "max_num_batched_tokens (128) must be >= max_num_seqs (256)",
        ),
        (
            {"enable_chunked_prefill": False, "max_num_batched_tokens": 2048, "max_model_len": 8192},
            "is smaller than max_model_len (8192)",
        ),
        (
            {"speculative": {"method": "eagle", "num_speculative_tokens": 3}},
            "speculative method 'eagle' needs a draft model",
        ),
        ({"speculative": {"method": "draft_model"}}, "'draft_model' needs a draft model"),
        (
            {
                "speculative": {
                    "method": "ngram",
                    "model": "x",
                    "num_speculative_tokens": 2,
                    "prompt_lookup_max": 3,
                }
            },
            "drafts without a model",
        ),
        ({"speculative": {"method": "ngram", "num_speculative_tokens": 2}}, "needs prompt_lookup_max"),
        ({"speculative": {"method": "ngram", "prompt_lookup_max": 3}}, "needs num_speculative_tokens"),
        (
            {
                "speculative": {
                    "method": "ngram",
                    "num_speculative_tokens": 2,
                    "prompt_lookup_max": 2,
                    "prompt_lookup_min": 5,
                }
            },
            "prompt_lookup_min (5) is larger than prompt_lookup_max (2)",
        ),
        (
            {"speculative": {"method": "mtp", "prompt_lookup_max": 2}},
            "only apply to speculative method 'ngram'",
        ),
        (
            {
                "tensor_parallel_size": 4,
                "gpus": [0, 1, 2, 3],
                "speculative": {"method": "eagle", "model": "h", "draft_tensor_parallel_size": 2},
            },
            "draft_tensor_parallel_size (2) must be 1 or the target's tensor_parallel_size (4)",
        ),
        ({"speculative": {"method": "mtp", "options": {"method": "ngram"}}}, "repeats keys"),
        ({"quantization": "fp4-magic"}, "quantization"),
        ({"kv_cache_dtype": "int4"}, "kv_cache_dtype"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"port": 65535, "replicas": 2}, "runs past 65535"),
        ({"extra_args": ["--port", "9000"]}, "extra_args must not set --port: it is set by port"),
        ({"extra_args": ["--api-key=abc"]}, "extra_args must not set --api-key"),
        ({"extra_args": ["-dp", "2"]}, "replicas"),
        ({"max_num_seqs": 8, "extra_args": ["--max-num-seqs", "16"]}, "knob 'max_num_seqs' already sets"),
        (
            {"tensor_parallel_size": 2, "gpus": [0, 1], "extra_args": ["-tp", "2"]},
            "knob 'tensor_parallel_size'",
        ),
        ({"extra_args": ["--no-enable-prefix-caching"]}, "knob 'enable_prefix_caching' already sets"),
        ({"restart_backoff_s": 10, "restart_backoff_max_s": 5}, "restart_backoff_max_s is smaller"),
        ({"max_num_sequences": 3}, "Extra inputs are not permitted"),
    ],
)
def test_contradictory_or_invalid_settings_are_refused_before_launch(
    knobs: dict[str, Any], message: str
) -> None:
    assert message in error_of(**knobs)


def test_knob_flag_table_names_real_flags() -> None:
    # The README table is generated from this mapping; each entry is a vllm serve flag.
    assert FLAG_OF_KNOB["max_num_seqs"] == "--max-num-seqs"
    assert FLAG_OF_KNOB["speculative"] == "--speculative-config"
    assert all(flag.startswith("--") for flag in FLAG_OF_KNOB.values())


VLLM_MISSING = importlib.util.find_spec("vllm") is None


def _vllm_serve_parser() -> Any:
    """vLLM's own parser of ``vllm serve`` flags (its location moved between versions)."""
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser  # type: ignore[attr-defined,no-redef]
    return make_arg_parser(FlexibleArgumentParser())


@pytest.mark.skipif(
    VLLM_MISSING,
    reason="vllm is not installed: it is the optional [local] extra (GPU machines only); "
    "the default and dev installs never pull it",
)
def test_generated_argv_is_accepted_by_vllms_own_parser() -> None:
    launch = VllmLaunch(
        model="org/model-7b",
        served_model_name="fast",
        max_num_seqs=64,
        max_num_batched_tokens=8192,
        gpu_memory_utilization=0.85,
        max_model_len=16384,
        quantization="fp8",
        kv_cache_dtype="fp8",
        calculate_kv_scales=True,
        tensor_parallel_size=2,
        gpus=[0, 1],
        enable_chunked_prefill=True,
        speculative={"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4},
    )
    argv = list(plan_replicas(launch, "d", {})[0].argv)
    # `vllm serve MODEL ...` == the API server's parser with --model MODEL.
    args = _vllm_serve_parser().parse_args(["--model", argv[2], *argv[3:]])
    assert args.model == "org/model-7b"
    assert args.port == 8001
    assert args.max_num_seqs == 64
    assert args.max_num_batched_tokens == 8192
    assert args.gpu_memory_utilization == 0.85
    assert args.max_model_len == 16384
    assert args.quantization == "fp8"
    assert args.kv_cache_dtype == "fp8"
    assert args.tensor_parallel_size == 2
    assert args.enable_prefix_caching is True
    assert args.enable_prompt_tokens_details is True
    assert args.speculative_config == {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}
    off = plan_replicas(VllmLaunch(model="m", enable_prefix_caching=False), "d", {})[0].argv
    assert _vllm_serve_parser().parse_args(["--model", "m", *off[3:]]).enable_prefix_caching is False


def test_without_a_gpu_the_cpu_kv_cache_is_sized_explicitly() -> None:
    # vLLM's CPU backend would otherwise take gpu_memory_utilization (0.92) of the RAM.
    plan = plan_replicas(VllmLaunch(model="m"), "d", {}, gpu=False)[0]
    assert plan.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "VLLM_CPU_KVCACHE_SPACE" not in plan_replicas(VllmLaunch(model="m"), "d", {}, gpu=True)[0].env
    sized = plan_replicas(VllmLaunch(model="m", cpu_kv_cache_gib=3), "d", {}, gpu=True)[0]
    assert sized.env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert "cpu_kv_cache_gib" in error_of(cpu_kv_cache_gib=0.5)  # vLLM reads whole GiB
    own = plan_replicas(VllmLaunch(model="m", env={"VLLM_CPU_KVCACHE_SPACE": "4"}), "d", {}, gpu=False)[0]
    assert own.env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert "cpu_kv_cache_gib and env.VLLM_CPU_KVCACHE_SPACE" in error_of(
        cpu_kv_cache_gib=1, env={"VLLM_CPU_KVCACHE_SPACE": "4"}
    )


def test_each_flag_names_the_knob_that_emits_it() -> None:
    assert knob_of_flag("--calculate-kv-scales") == "calculate_kv_scales"
    assert knob_of_flag("--no-enable-prefix-caching") == "enable_prefix_caching"
    assert knob_of_flag("-tp") == "tensor_parallel_size"
    assert knob_of_flag("--served-model-name") == "served_model_name"
    assert knob_of_flag("--not-a-knob") is None
