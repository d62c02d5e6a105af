"""The ``switchyard`` command.

Each command group registers itself with :func:`_register_*`; a stage that adds
commands (``route``, ``stats``, ``batch`` ...) adds one registrar to ``REGISTRARS``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import orjson
from redis.exceptions import RedisError

from gateway.auth import cli as keys_cli
from gateway.cache import cli as cache_cli
from gateway.cachestats import cli as stats_cli
from gateway.config import PolicyError, Settings, load_policy
from gateway.policy import Policy
from gateway.routing.learn import cli as routing_cli
from gateway.store import check_url as check_redis_url
from gateway.tools import batch, bench
from gateway.tools.fleet import cli as fleet_cli


def _register_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="run the gateway",
        description="Run the gateway. With no policy and no REDIS_URL it starts an embedded Redis "
        "and the built-in simulator (deployments sim-fast and sim-strong).",
    )
    p.add_argument("--host", help="address to bind (SWITCHYARD_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (SWITCHYARD_PORT, default 8080)")
    p.add_argument(
        "--policy", help="policy YAML file (SWITCHYARD_POLICY); default: the embedded simulator policy"
    )
    p.add_argument("--workers", type=int, help="processes sharing the port (SWITCHYARD_WORKERS, default 1)")
    p.add_argument("--redis-url", help="Redis URL (REDIS_URL); default: an embedded redis-server")
    p.add_argument("--log-format", choices=["json", "console"], help="SWITCHYARD_LOG_FORMAT, default json")
    p.add_argument(
        "--auth",
        choices=["auto", "keys", "none"],
        help="SWITCHYARD_AUTH: keys (a virtual key on every /v1 request), none, or auto (default: "
        "none on a loopback bind, keys otherwise)",
    )
    p.add_argument(
        "--insecure-no-auth",
        action="store_true",
        default=None,
        help="allow --auth none on a non-loopback address (SWITCHYARD_INSECURE_NO_AUTH)",
    )
    p.set_defaults(func=_cmd_serve)


def _cmd_serve(args: argparse.Namespace) -> int:
    from gateway import runner
    from gateway.telemetry import logging as tlog

    try:
        settings = Settings.from_env(
            host=args.host,
            port=args.port,
            policy=args.policy,
            workers=args.workers,
            redis_url=args.redis_url,
            log_format=args.log_format,
            auth=args.auth,
            insecure_no_auth=args.insecure_no_auth,
        )
        settings.auth_mode()
        if settings.redis_url is not None:
            check_redis_url(settings.redis_url)
    except ValueError as exc:
        print(f"switchyard: bad settings: {_one_line(exc)}", file=sys.stderr)
        return 2
    tlog.configure(settings.log_level, settings.log_format)
    try:
        return runner.serve(settings)
    except PolicyError as exc:
        _print_policy_error(exc)
        return 1
    except runner.SetupError as exc:
        print(f"switchyard: {exc}", file=sys.stderr)
        return 2
    finally:
        tlog.shutdown()


def _one_line(exc: ValueError) -> str:
    """A settings error as one line (pydantic's own text spans several)."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'value'}: {err['msg']}" for err in exc.errors()
        )
    return str(exc)


def _print_policy_error(exc: PolicyError) -> None:
    for issue in exc.issues:
        where = f"{exc.source}:{issue.line}" if issue.line else exc.source
        print(f"{where}: {issue.path or '(top level)'}: {issue.message}", file=sys.stderr)


def _register_policy(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("policy", help="check a policy file or export its JSON schema")
    psub = p.add_subparsers(dest="policy_command", required=True)
    check = psub.add_parser("check", help="validate a policy; print every error with its path; exit 1 if any")
    check.add_argument("file")
    check.set_defaults(func=_cmd_policy_check)
    schema = psub.add_parser("schema", help="print (or write) the policy's JSON schema")
    schema.add_argument("--out", help="write to this file instead of stdout")
    schema.set_defaults(func=_cmd_policy_schema)
    push = psub.add_parser(
        "push",
        help="validate a policy and push it to Redis for every gateway started with "
        "SWITCHYARD_POLICY_FROM_REDIS=1 (each swaps to it within its reload interval)",
    )
    push.add_argument("file")
    push.add_argument("--redis-url", help="the fleet's Redis (REDIS_URL), e.g. redis+cluster://redis-0:6379")
    push.set_defaults(func=_cmd_policy_push)


def _cmd_policy_check(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.file)
    except PolicyError as exc:
        _print_policy_error(exc)
        print(f"{len(exc.issues)} error(s)", file=sys.stderr)
        return 1
    if not _launches_pass(args.file, policy):
        return 1
    print(
        f"{args.file}: ok ({len(policy.deployments)} deployments, tiers: {', '.join(policy.tiers) or 'none'})"
    )
    return 0


def _cmd_policy_push(args: argparse.Namespace) -> int:
    import asyncio
    import os

    from gateway.store import connect
    from gateway.store.policy import push_policy

    try:
        load_policy(args.file)
    except PolicyError as exc:
        _print_policy_error(exc)
        print(f"{len(exc.issues)} error(s): nothing pushed", file=sys.stderr)
        return 1
    url = args.redis_url or os.environ.get("REDIS_URL")
    if not url:
        print("switchyard: policy push needs the fleet's Redis: --redis-url or REDIS_URL", file=sys.stderr)
        return 2
    try:
        check_redis_url(url)
    except ValueError as exc:
        print(f"switchyard: bad settings: {exc}", file=sys.stderr)
        return 2

    text, source = Path(args.file).read_bytes(), os.path.abspath(args.file)

    async def push() -> str:
        redis = connect(url)
        try:
            return await push_policy(redis, text, source)
        finally:
            await redis.aclose()

    try:
        digest = asyncio.run(push())
    except (OSError, RedisError) as exc:
        print(f"switchyard: could not push to Redis: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"{args.file}: pushed, digest {digest} (gateways following Redis report it in /readyz)")
    return 0


def _launches_pass(source: str, policy: Policy) -> bool:
    """Run the preflight of every ``launch:`` (as ``serve`` does before starting vLLM) where
    vLLM is installed; say which launches could not be checked. False: one was refused."""
    launches = {name: d.launch for name, d in policy.deployments.items() if d.launch is not None}
    if not launches:
        return True
    import asyncio
    import os

    from local_backend.vllm._preflight import check_launches

    found = asyncio.run(check_launches(launches, os.environ))
    for name, why in sorted(found.unchecked.items()):
        print(f"{source}: deployments.{name}.launch: not checked against vLLM: {why}", file=sys.stderr)
    for name, why in sorted(found.refused.items()):
        print(f"{source}: deployments.{name}.launch: {why}", file=sys.stderr)
    if found.refused:
        print(f"{len(found.refused)} error(s)", file=sys.stderr)
    return not found.refused


def policy_schema_json() -> bytes:
    from gateway.policy import Policy

    return orjson.dumps(Policy.model_json_schema(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


def _cmd_policy_schema(args: argparse.Namespace) -> int:
    data = policy_schema_json()
    if args.out:
        Path(args.out).write_bytes(data)
    else:
        sys.stdout.buffer.write(data)
    return 0


def _register_sim(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    import local_backend.sim as sim

    p = sub.add_parser("sim", help="run the OpenAI-compatible simulator (test and benchmark upstream)")
    sim.add_arguments(p)
    p.set_defaults(func=sim.run)


def _register_local(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from local_backend.vllm import register_cli

    register_cli(sub)


REGISTRARS: list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = [
    _register_serve,
    _register_policy,
    _register_sim,
    _register_local,
    batch.register,
    routing_cli.register,
    stats_cli.register,
    bench.register,
    keys_cli.register,
    cache_cli.register,
    fleet_cli.register,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="switchyard", description="An OpenAI-compatible LLM gateway.")
    sub = parser.add_subparsers(dest="command", required=True)
    for register in REGISTRARS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
