"""The knobs of a ``vllm serve`` launch, their validation, and their mapping to vLLM's flags.

Every knob maps to one flag of ``vllm serve`` (or, for ``cpu_kv_cache_gib``, one variable of
its environment). Settings that contradict each other are reported by :class:`VllmLaunch`
validation; flags the installed vLLM does not know (``--calculate-kv-scales`` is gone in
0.32) are refused before launch by the local backend's preflight, which runs the argv
through that vLLM's own parser, wherever the version keeps it (see docs/local-backend.md). This is the
spec the policy validates (a deployment's ``launch:`` block); turning it into command
lines is :mod:`gateway.replicas.launch_plan`; running them is the local backend's supervisor.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import Field, field_validator, model_validator

from gateway.validation import Seconds, StrictModel

Quantization = Literal[
    "fp8",
    "awq",
    "awq_marlin",
    "gptq",
    "gptq_marlin",
    "compressed-tensors",
    "bitsandbytes",
    "gguf",
    "marlin",
    "fbgemm_fp8",
    "modelopt",
    "experts_int8",
    "mxfp4",
    "torchao",
]
"""Quantization methods named here are passed as ``--quantization``; vLLM versions add
others, which can still be given in ``extra_args``."""

KvCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
ModelDtype = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]
SpeculativeMethod = Literal[
    "ngram", "eagle", "eagle3", "draft_model", "medusa", "mlp_speculator", "mtp", "suffix"
]
# Methods whose proposer is a separate set of weights named by ``model``.
_NEEDS_DRAFT_MODEL = frozenset({"eagle", "eagle3", "draft_model", "medusa", "mlp_speculator"})
# Methods that draft from the prompt or the output itself: a ``model`` would be ignored.
_NO_DRAFT_MODEL = frozenset({"ngram", "suffix"})
DEFAULT_CPU_KV_CACHE_GIB = 1
"""KV cache size of a launch on a machine without a GPU when ``cpu_kv_cache_gib`` is unset."""
CPU_KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"


class SpeculativeDecoding(StrictModel):
    """vLLM's ``--speculative-config`` (a JSON object with these keys).

    - ``method``: ``ngram`` (prompt lookup, needs ``prompt_lookup_max``), ``eagle``/``eagle3``,
      ``draft_model``, ``medusa``, ``mlp_speculator`` (all need ``model``: the draft weights),
      ``mtp`` (the model's own multi-token-prediction heads) or ``suffix``.
    - ``num_speculative_tokens``: tokens proposed per step (vLLM takes it from the draft
      model's config when it has one; required for ``ngram``).
    - ``options``: more keys of vLLM's SpeculativeConfig, passed as given.
    """

    method: SpeculativeMethod
    model: str | None = Field(None, description="Draft model / EAGLE head (HF id or path).")
    num_speculative_tokens: int | None = Field(None, ge=1, le=64)
    prompt_lookup_max: int | None = Field(None, ge=1, description="ngram: longest n-gram looked up.")
    prompt_lookup_min: int | None = Field(None, ge=1, description="ngram: shortest n-gram looked up.")
    draft_tensor_parallel_size: int | None = Field(
        None, ge=1, description="Tensor parallel size of the draft model: 1 or the target's."
    )
    options: dict[str, Any] = Field(default_factory=dict, description="More SpeculativeConfig keys.")

    @model_validator(mode="after")
    def _coherent(self) -> SpeculativeDecoding:
        if self.method in _NEEDS_DRAFT_MODEL and not self.model:
            raise ValueError(
                f"speculative method '{self.method}' needs a draft model: set speculative.model "
                "to the draft weights (a Hugging Face id or a local path)"
            )
        if self.method in _NO_DRAFT_MODEL and self.model:
            raise ValueError(
                f"speculative method '{self.method}' drafts without a model; remove speculative.model "
                "(or use method draft_model)"
            )
        if self.method == "ngram":
            if self.num_speculative_tokens is None:
                raise ValueError("speculative method 'ngram' needs num_speculative_tokens")
            if self.prompt_lookup_max is None:
                raise ValueError("speculative method 'ngram' needs prompt_lookup_max (e.g. 4)")
        elif self.prompt_lookup_max is not None or self.prompt_lookup_min is not None:
            raise ValueError("prompt_lookup_max/prompt_lookup_min only apply to speculative method 'ngram'")
        if (
            self.prompt_lookup_min is not None
            and self.prompt_lookup_max is not None
            and self.prompt_lookup_min > self.prompt_lookup_max
        ):
            raise ValueError(
                f"prompt_lookup_min ({self.prompt_lookup_min}) is larger than "
                f"prompt_lookup_max ({self.prompt_lookup_max})"
            )
        reserved = {"method", "model", "num_speculative_tokens", "draft_tensor_parallel_size"}
        reserved |= {"prompt_lookup_max", "prompt_lookup_min"}
        clash = sorted(reserved & set(self.options))
        if clash:
            raise ValueError(f"speculative.options repeats keys that have their own setting: {clash}")
        return self

    def to_json(self) -> str:
        """The ``--speculative-config`` value."""
        data: dict[str, Any] = {"method": self.method}
        for key in (
            "model",
            "num_speculative_tokens",
            "prompt_lookup_max",
            "prompt_lookup_min",
            "draft_tensor_parallel_size",
        ):
            value = getattr(self, key)
            if value is not None:
                data[key] = value
        data.update(self.options)
        return orjson.dumps(data).decode()


# Knob -> flag of `vllm serve`. Booleans use vLLM's BooleanOptionalAction pair
# (--flag / --no-flag); None means "leave vLLM's default".
_VALUE_FLAGS: tuple[tuple[str, str], ...] = (
    ("tensor_parallel_size", "--tensor-parallel-size"),
    ("pipeline_parallel_size", "--pipeline-parallel-size"),
    ("max_num_seqs", "--max-num-seqs"),
    ("max_num_batched_tokens", "--max-num-batched-tokens"),
    ("gpu_memory_utilization", "--gpu-memory-utilization"),
    ("max_model_len", "--max-model-len"),
    ("quantization", "--quantization"),
    ("kv_cache_dtype", "--kv-cache-dtype"),
    ("dtype", "--dtype"),
    ("block_size", "--block-size"),
    ("seed", "--seed"),
)
_BOOL_FLAGS: tuple[tuple[str, str], ...] = (
    ("enable_prefix_caching", "--enable-prefix-caching"),
    ("enable_prompt_tokens_details", "--enable-prompt-tokens-details"),
    ("enable_chunked_prefill", "--enable-chunked-prefill"),
    ("calculate_kv_scales", "--calculate-kv-scales"),
    ("enforce_eager", "--enforce-eager"),
    ("trust_remote_code", "--trust-remote-code"),
)
# Short aliases vLLM accepts for flags the launcher sets itself.
_ALIASES = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size", "-q": "--quantization"}
# Flags the launcher always owns: per-replica placement, the model, the secret.
_OWNED = {
    "--host": "host",
    "--port": "port",
    "--model": "model",
    "--served-model-name": "served_model_name",
    "--api-key": "api_key_env (the key is passed as VLLM_API_KEY, never on the command line)",
    "--data-parallel-size": "replicas (each replica is its own vllm serve on its own GPUs and port)",
    "-dp": "replicas (each replica is its own vllm serve on its own GPUs and port)",
}
FLAG_OF_KNOB: dict[str, str] = {
    **dict(_VALUE_FLAGS),
    **dict(_BOOL_FLAGS),
    "speculative": "--speculative-config",
    "host": "--host",
    "port": "--port",
    "served_model_name": "--served-model-name",
}
"""Each knob's ``vllm serve`` flag (documented in docs/local-backend.md)."""


def knob_of_flag(flag: str) -> str | None:
    """The knob that emits ``flag`` (``--no-x`` counts as ``--x``), or ``None`` (extra_args)."""
    base = "--" + flag[5:] if flag.startswith("--no-") else flag
    base = _ALIASES.get(base, base)
    return next((knob for knob, f in FLAG_OF_KNOB.items() if f == base), None)


class VllmLaunch(StrictModel):
    """How to start and supervise ``vllm serve`` for one model: N replicas, each on its own
    GPUs (``CUDA_VISIBLE_DEVICES``) and port (``port + i``). See README for every knob."""

    model: str | None = Field(
        None, description="What vLLM loads (HF id or path); in a policy: defaults to the deployment's model."
    )
    served_model_name: str | None = Field(
        None, description="The name vLLM answers to; in a policy: the deployment's model (or name)."
    )
    host: str = Field("127.0.0.1", description="Address each replica binds.")
    port: int = Field(8001, ge=1, le=65535, description="Port of replica 0; replica i listens on port + i.")
    replicas: int = Field(1, ge=1, le=64, description="Independent vllm serve processes (data parallel).")
    gpus: list[int | str] | None = Field(
        None,
        description="GPU ids (or UUIDs) to spread the replicas over; default: CUDA_VISIBLE_DEVICES, "
        "else 0..N-1.",
    )
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    pipeline_parallel_size: int = Field(1, ge=1, le=64)
    max_num_seqs: int | None = Field(None, ge=1, description="Max sequences per batch (batch size).")
    max_num_batched_tokens: int | None = Field(None, ge=1, description="Max tokens per scheduler step.")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="Share of GPU memory for weights + KV cache (vLLM default 0.9)."
    )
    max_model_len: int | None = Field(None, ge=1, description="Context length (default: the model's).")
    quantization: Quantization | None = None
    kv_cache_dtype: KvCacheDtype | None = Field(
        None, description="KV cache storage type (vLLM default auto)."
    )
    calculate_kv_scales: bool | None = Field(
        None, description="Compute fp8 KV scales on the fly (vLLM < 0.32; later versions refuse it)."
    )
    cpu_kv_cache_gib: int | None = Field(
        None,
        ge=1,
        description="vLLM's CPU backend: whole GiB of RAM for the KV cache (VLLM_CPU_KVCACHE_SPACE). Without "
        f"a GPU on this machine the default is {DEFAULT_CPU_KV_CACHE_GIB} GiB (vLLM's own default "
        "reserves most of the RAM); ignored by GPU backends.",
    )
    dtype: ModelDtype | None = None
    block_size: int | None = Field(None, ge=1, description="KV cache block size in tokens.")
    seed: int | None = None
    enable_prefix_caching: bool = Field(True, description="Automatic prefix caching (on by default).")
    enable_prompt_tokens_details: bool = Field(
        True, description="usage.prompt_tokens_details.cached_tokens in answers (on by default)."
    )
    enable_chunked_prefill: bool | None = None
    enforce_eager: bool | None = None
    trust_remote_code: bool | None = None
    speculative: SpeculativeDecoding | None = None
    extra_args: list[str] = Field(default_factory=list, description="More vllm serve flags, passed as given.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for every replica.")
    executable: str = Field("vllm", description="The vllm executable (a name on PATH or a path).")
    api_key_env: str | None = Field(
        None, description="Env var whose value the replicas require as API key (passed as VLLM_API_KEY)."
    )
    startup_timeout_s: Seconds = Field(900.0, gt=0, description="Longest wait for /health after a start.")
    health_interval_s: Seconds = Field(
        2.0, gt=0, description="How often a running replica's /health is polled."
    )
    health_failures_to_restart: int = Field(
        3, ge=1, description="Consecutive failed health checks after which a replica is restarted."
    )
    drain_timeout_s: Seconds = Field(30.0, ge=0, description="SIGTERM -> SIGKILL grace on stop.")
    exit_wait_s: Seconds = Field(
        10.0,
        ge=0,
        description="After a replica's process ended, the longest wait for the rest of its group "
        "and its output before a restart (what is left is logged; a port still held: a fresh one).",
    )
    restart_backoff_s: Seconds = Field(
        1.0, gt=0, description="First wait before a restart; doubles each time."
    )
    restart_backoff_max_s: Seconds = Field(60.0, gt=0, description="Longest wait between restarts.")
    stable_after_s: Seconds = Field(60.0, gt=0, description="Healthy this long resets the restart backoff.")
    max_restarts: int | None = Field(
        None, ge=0, description="Give up after this many restarts (null: never)."
    )

    @field_validator("gpus")
    @classmethod
    def _distinct_gpus(cls, value: list[int | str] | None) -> list[int | str] | None:
        if value is not None:
            if not value:
                raise ValueError("gpus must list at least one GPU (or be left out)")
            seen = [str(g) for g in value]
            if len(set(seen)) != len(seen):
                raise ValueError(f"gpus lists a GPU twice: {value}")
        return value

    @field_validator("extra_args")
    @classmethod
    def _no_owned_flags(cls, value: list[str]) -> list[str]:
        for arg in value:
            flag = arg.split("=", 1)[0]
            owner = _OWNED.get(flag)
            if owner is not None:
                raise ValueError(f"extra_args must not set {flag}: it is set by {owner}")
        return value

    @model_validator(mode="after")
    def _coherent(self) -> VllmLaunch:
        world = self.tensor_parallel_size * self.pipeline_parallel_size
        if self.gpus is not None and world * self.replicas > len(self.gpus):
            raise ValueError(
                f"tensor_parallel_size ({self.tensor_parallel_size}) x pipeline_parallel_size "
                f"({self.pipeline_parallel_size}) x replicas ({self.replicas}) = {world * self.replicas} "
                f"GPUs needed, but gpus lists {len(self.gpus)}: {self.gpus}"
            )
        if self.port + self.replicas - 1 > 65535:
            raise ValueError(f"port {self.port} + {self.replicas} replicas runs past 65535")
        if self.calculate_kv_scales and (self.kv_cache_dtype or "auto") == "auto":
            raise ValueError(
                "calculate_kv_scales only applies to an fp8 KV cache: set kv_cache_dtype to fp8 "
                "(or fp8_e4m3 / fp8_e5m2), or drop calculate_kv_scales"
            )
        if (
            self.max_num_batched_tokens is not None
            and self.max_num_seqs is not None
            and self.max_num_batched_tokens < self.max_num_seqs
        ):
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}): every sequence in a batch needs at least one token per step"
            )
        if (
            self.enable_chunked_prefill is False
            and self.max_num_batched_tokens is not None
            and self.max_model_len is not None
            and self.max_num_batched_tokens < self.max_model_len
        ):
            raise ValueError(
                f"without chunked prefill a whole prompt must fit one step: max_num_batched_tokens "
                f"({self.max_num_batched_tokens}) is smaller than max_model_len ({self.max_model_len})"
            )
        spec = self.speculative
        if (
            spec is not None
            and spec.draft_tensor_parallel_size is not None
            and spec.draft_tensor_parallel_size not in (1, self.tensor_parallel_size)
        ):
            raise ValueError(
                f"speculative.draft_tensor_parallel_size ({spec.draft_tensor_parallel_size}) must be 1 "
                f"or the target's tensor_parallel_size ({self.tensor_parallel_size})"
            )
        if self.restart_backoff_max_s < self.restart_backoff_s:
            raise ValueError("restart_backoff_max_s is smaller than restart_backoff_s")
        if self.cpu_kv_cache_gib is not None and CPU_KV_CACHE_ENV in self.env:
            raise ValueError(
                f"cpu_kv_cache_gib and env.{CPU_KV_CACHE_ENV} both size the CPU KV cache: keep one"
            )
        self._check_extra_args_against_knobs()
        return self

    def _check_extra_args_against_knobs(self) -> None:
        emitted = set(self.knob_flags())
        for arg in self.extra_args:
            flag = _ALIASES.get(arg.split("=", 1)[0], arg.split("=", 1)[0])
            base = "--" + flag[5:] if flag.startswith("--no-") else flag
            if base in emitted:
                knob = next(k for k, f in FLAG_OF_KNOB.items() if f == base)
                raise ValueError(
                    f"extra_args sets {arg.split('=', 1)[0]}, which the knob '{knob}' already sets"
                )

    @property
    def gpus_per_replica(self) -> int:
        """tensor_parallel_size x pipeline_parallel_size."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def knob_flags(self) -> dict[str, list[str]]:
        """Flag -> its argv words, for the knobs that emit one (set ones, and the defaults we own)."""
        out: dict[str, list[str]] = {}
        for knob, flag in _VALUE_FLAGS:
            value = getattr(self, knob)
            if knob in ("tensor_parallel_size", "pipeline_parallel_size") and value == 1:
                continue  # vLLM's default; keeps the command line short
            if value is not None:
                out[flag] = [flag, _flag_value(value)]
        for knob, flag in _BOOL_FLAGS:
            value = getattr(self, knob)
            if value is True:
                out[flag] = [flag]
            elif value is False:
                out[flag] = ["--no-" + flag[2:]]
        if self.speculative is not None:
            out["--speculative-config"] = ["--speculative-config", self.speculative.to_json()]
        return out

    def replica_urls(self) -> list[str]:
        """Each replica's OpenAI base URL, ``http://host:port+i/v1`` (a wildcard bind: on loopback)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        if ":" in host:
            host = f"[{host}]"
        return [f"http://{host}:{self.port + i}/v1" for i in range(self.replicas)]


def _flag_value(value: object) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(value)
