# SPDX-License-Identifier: Apache-2.0
"""`vllm serve` as users run it, for the e2e tests and the soak
(scripts/soak.sh): the OpenAI-compatible server on 127.0.0.1 with a tiny
model, the engine core in its own process, the whole process group stopped
whatever happens."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import psutil
import requests
from prometheus_client.parser import text_string_to_metric_families

from e2e.engine_utils import kernel_libraries, kv_transfer_config
from e2e.tiny_models import BLOCK_SIZE

TESTS_DIR = Path(__file__).resolve().parents[1]
# Hang guards, not speed requirements: the server starts in about 25 s here
# (2 cores), 53 s was seen on a slower 2-core machine. Below the per-test
# guard (conftest.TEST_TIMEOUT_S) so a failure comes with the server log.
STARTUP_TIMEOUT = 400
EXIT_TIMEOUT = 30  # for the processes of a server that stopped


class ServerError(RuntimeError):
    """The server exited or did not come up; the message ends with its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(
    model_path: str,
    port: int,
    *extra: str,
    kv_cache_bytes: int = 64 << 20,
    kv_transfer: dict | None = None,
    block_size: int | None = BLOCK_SIZE,
    dtype: str = "float32",
) -> list[str]:
    """The server's command line. kv_transfer=None: the OffloadingConnector
    with the host-copy spec (e2e.engine_utils.kv_transfer_config); {}: no
    connector. block_size=None leaves the block size to vLLM."""
    vllm_cli = Path(sys.executable).parent / "vllm"
    launcher = (
        [str(vllm_cli)]
        if vllm_cli.exists()
        else [sys.executable, "-m", "vllm.entrypoints.cli.main"]
    )
    if kv_transfer is None:
        kv_transfer = kv_transfer_config()
    connector = ["--kv-transfer-config", json.dumps(kv_transfer)] if kv_transfer else []
    block = ["--block-size", str(block_size)] if block_size else []
    return [
        *launcher,
        "serve",
        model_path,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--served-model-name", "tiny",
        "--dtype", dtype,
        *block,
        "--max-model-len", "2048",
        "--kv-cache-memory-bytes", str(kv_cache_bytes),
        "--enforce-eager",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        *connector,
        *extra,
    ]  # fmt: skip


def serve_env(**extra: str) -> dict:
    env = dict(os.environ)
    # Run the engine core in its own process, as `vllm serve` users do.
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    env.pop("VLLM_PREFIX_CACHE_RETENTION_INTERVAL", None)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(TESTS_DIR), env.get("PYTHONPATH")])
    )
    env.update(extra)
    return env


def start_server(cmd: list[str], env: dict, log_path: Path) -> subprocess.Popen:
    """The server in a new session (it leads its own process group)."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def group_processes(pgid: int) -> list[psutil.Process]:
    alive = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return alive


def wait_group_empty(pgid: int, timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while (alive := group_processes(pgid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    wait_group_empty(proc.pid, 10)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def stop_group(proc: subprocess.Popen) -> list[psutil.Process]:
    """SIGTERM the server's process group (start_new_session: it leads its
    own); returns what was still running EXIT_TIMEOUT later, then SIGKILLs
    that."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    survivors = wait_group_empty(proc.pid, EXIT_TIMEOUT)
    if survivors:
        kill_group(proc)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    return survivors


def read_log(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def run_until_exit(
    cmd: list[str], env: dict, log_path: Path
) -> tuple[int | None, list[psutil.Process], str]:
    """Start a server that must stop on its own (a bad setting): its exit
    status (None if it still ran after STARTUP_TIMEOUT), the processes of its
    group still running EXIT_TIMEOUT after it exited (its engine core and
    workers must follow it unsignalled), and its log. The group is stopped
    whatever happens."""
    proc = start_server(cmd, env, log_path)
    try:
        rc = proc.wait(timeout=STARTUP_TIMEOUT)
        left = wait_group_empty(proc.pid, EXIT_TIMEOUT)
    except subprocess.TimeoutExpired:
        rc, left = None, []
    finally:
        stop_group(proc)
    return rc, left, read_log(log_path)


def group_kernel_libraries(pgid: int) -> list[str]:
    libs = set()
    for p in group_processes(pgid):
        try:
            libs.update(kernel_libraries(p.pid))
        except OSError:
            pass
    return sorted(libs)


def wait_healthy(proc: subprocess.Popen, base: str, log_path: Path) -> None:
    """Until the server answers /health; raises ServerError with its log if
    it exits or is not up within STARTUP_TIMEOUT."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while True:
        if proc.poll() is not None:
            raise ServerError(
                f"server exited ({proc.returncode}):\n{read_log(log_path)[-4000:]}"
            )
        try:
            if requests.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        if time.monotonic() > deadline:
            raise ServerError(
                f"not up in {STARTUP_TIMEOUT}s:\n{read_log(log_path)[-4000:]}"
            )
        time.sleep(1)


def samples(metrics_text: str) -> tuple[dict[str, float], dict[str, list[dict]]]:
    """Sample values summed over label sets, and the label sets per sample."""
    values: dict[str, float] = defaultdict(float)
    labels: dict[str, list[dict]] = defaultdict(list)
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            values[s.name] += s.value
            labels[s.name].append(s.labels)
    return dict(values), dict(labels)


def complete(base: str, tokens: list[int]) -> dict:
    """A greedy 12-token completion of ``tokens`` with the chosen tokens'
    logprobs and token ids."""
    resp = requests.post(
        f"{base}/v1/completions",
        json={
            "model": "tiny",
            "prompt": tokens,
            "max_tokens": 12,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
            "logprobs": 0,  # the chosen tokens' logprobs
        },
        timeout=120,
    )
    resp.raise_for_status()
    return resp.json()


def cached_tokens(completion: dict) -> int:
    details = completion["usage"].get("prompt_tokens_details") or {}
    return details.get("cached_tokens") or 0
