# SPDX-License-Identifier: Apache-2.0
"""Soak: `vllm serve` on the CPU platform under concurrent load, with a CPU
offload tier a few requests large (stores refused, chunks evicted), an engine
KV cache small enough to preempt, clients that abort mid-stream and bad
requests; then the offload manager's accounting once idle, SIGTERM with
requests in flight, and every completed greedy request against a reference
server without the connector.

    python -m bench.soak [--quick] [--minutes N] [--out DIR] [--report FILE]

scripts/soak.sh runs it in the project's venv. Exits 1 when an assertion
fails (listed at the end of the output and in DIR/summary.json).

Models are the e2e tests' tiny random-weight ones (tests/e2e/tiny_models.py):
the Gemma-3-like hybrid (sliding window 32 + full attention, fp32) and the
Granite-4.0-H-like Mamba hybrid (bf16, "align" Mamba cache). The offload
tier is vLLM's CPUOffloadingManager behind the host-copy spec, with the
ledger of tests/e2e/offload_audit.py."""

import argparse
import asyncio
import dataclasses
import json
import os
import random
import signal
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import psutil
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
# The reference engine runs in this process (the servers are started without
# these); set before vLLM is imported.
for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "TORCHDYNAMO_DISABLE": "1",
}.items():
    os.environ.setdefault(_key, _value)

from e2e.engine_utils import LOGPROB_ATOL, kv_transfer_config, prompt  # noqa: E402
from e2e.serve_utils import (  # noqa: E402
    ServerError,
    free_port,
    group_processes,
    kill_group,
    read_log,
    samples,
    serve_command,
    serve_env,
    start_server,
    wait_healthy,
)
from e2e.tiny_models import (  # noqa: E402
    MAMBA_STEP_TOKENS,
    gemma3_hybrid,
    granite_hybrid,
)

MAX_MODEL_LEN = 2048
CLIENTS = 8
ABORT_FRACTION = 0.15  # of the load's requests: streams the client drops
BAD_FRACTION = 0.06
# Per model: the engine KV cache (about 2,500 tokens: one max_model_len
# request fits, far fewer than 8 clients' prompts and outputs need at once,
# so requests wait and are preempted, and the GPU prefix cache evicts what the
# offload tier can still serve) and the CPU tier (a few agentic prompts of the
# sixteen sessions' working set, so it evicts).
KV_CACHE_BYTES = {"gemma": 5 << 20, "granite": 3 << 19}
CPU_BYTES = {"gemma": 8 << 20, "granite": 3 << 20}
SHUTDOWN_BOUND_S = 30  # SIGTERM to exit, and to every client's answer
SHUTDOWN_REQUESTS = 4
# Greedy tokens must equal the reference's, except past a near tie: where
# the reference's best two logprobs are within what rounding moves them, the
# batch shape can pick either. fp32 rounding moves a logprob by about 1e-6
# (Gemma: LOGPROB_ATOL, and its logprobs are compared to it); bf16 GEMMs
# round by batch shape by up to about 0.05 (shared/notes/e2e-on-cpu.md), so
# Granite's logprobs are not compared and its ties are wider.
TIE_MARGIN = {"gemma": LOGPROB_ATOL, "granite": 0.125}
# bf16 only: under concurrent load no reference has the server's batch
# shapes, and rounding by shape compounds over a generation, so a bf16
# request may also part from the reference past a near tie. Such requests
# fail a run only when they are more than this share of its completed
# requests: the same load without the connector (--control) parts on 6.1%
# (20 of 329); loads that write zeros (--corrupt-loads) part far more often.
# fp32 (Gemma) has no such allowance: every divergence past a tie fails.
BF16_DIVERGENCE_SHARE = {"granite": 0.15}
PREEMPTING_CLIENTS = 3  # open with a long generation each: together they
# need more KV blocks than the engine has, so one is preempted
# vLLM's fp32 CPU GEMMs are oneDNN primitives, and oneDNN also caches one
# per (shape, token count) it meets, up to 1,024 (its default capacity): the
# worker then grows with the distinct batch sizes it serves, for reasons
# outside the offload path (python -m bench.onednn_cache_rss: +816 MiB over
# 1,000 token counts on the tiny Gemma's shapes, flat with the cache off;
# Granite's bf16 GEMMs fall back to torch on AVX2 and stay flat). The soak
# turns that cache off so that its memory bound measures the rest; vLLM's
# own per-layer caches of oneDNN primitives stay on.
SERVER_ENV = {"TORCHDYNAMO_DISABLE": "1", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0"}
MEMORY_WARMUP_FRACTION = 0.25  # of a run's requests before growth is measured
MEMORY_GROWTH_BOUND_MIB = 64  # per 1,000 requests after warm-up (full runs)

# The workload: a fixed pool, so requests repeat (offload and GPU hits) and
# the reference computes each distinct prompt once.
SYSTEM = prompt(256, seed=7001)  # shared by every agentic session
FEW_SHOT = [prompt(608, seed=7100 + j) for j in range(2)]
NUM_SESSIONS, NUM_TURNS, TURN_TOKENS, TURN_OUTPUT = 16, 6, 40, 24
NUM_QUESTIONS, QUESTION_TOKENS, ANSWER_TOKENS = 24, 36, 8
LONG_OUTPUT = 1024  # long generations: decode grows until someone is preempted


@dataclass(frozen=True)
class RunSpec:
    model: str  # gemma | granite
    retention: int | None
    policy: str  # lru | arc
    seconds: float
    # False: a control run, the same load on a server without the connector
    # (to tell divergences from the reference that offloading causes from
    # those of batch-shape rounding); its offload assertions fail by design.
    connector: bool = True
    # True: a negative control, the connector's loads write zeros instead of
    # the stored blocks (the output assertions must then fail).
    corrupt_loads: bool = False
    cpu_bytes: int = 0  # the CPU tier; 0: CPU_BYTES of the model

    @property
    def name(self) -> str:
        control = "" if self.connector else "-control"
        corrupt = "-corrupt" if self.corrupt_loads else ""
        return f"{self.model}-{self.retention}-{self.policy}{control}{corrupt}"


# The quick run shares 2 cores with the test command's other lane and may
# serve a third fewer requests: its tier is small enough to evict anyway
# (7.5 MB stored in 35 s of a loaded run; 9.6 MB idle).
QUICK = [RunSpec("gemma", 0, "lru", 35, cpu_bytes=4 << 20)]


def full_runs(minutes: float) -> list[RunSpec]:
    seconds = minutes * 60 / 6
    return [
        RunSpec(model, retention, policy, seconds)
        for model, policies in (("gemma", "lru arc lru"), ("granite", "arc lru arc"))
        for retention, policy in zip((None, 0, 512), policies.split())
    ]


def model_args(model: str) -> tuple[dict, list[str]]:
    """serve_command keyword arguments and extra flags per model."""
    if model == "gemma":
        return {"dtype": "float32"}, []
    return {"dtype": "bfloat16", "block_size": None}, [
        "--mamba-cache-mode", "align",
        "--max-num-batched-tokens", str(MAMBA_STEP_TOKENS),
        "--mamba-ssm-cache-dtype", "float32",
    ]  # fmt: skip


@dataclass
class Record:
    kind: str  # agentic | few_shot | bad:<what> | shutdown
    prompt_id: int = -1
    max_tokens: int = 0
    stream: bool = False
    aborted: bool = False  # by the client, on purpose
    status: int = 0  # HTTP status; 0: no response (connection error)
    error: str = ""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    # Reference only: best logprob minus the runner-up's, per position.
    margins: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    cached_tokens: int = 0
    latency_s: float = 0.0


class Prompts:
    """Distinct prompts of a model, by id (agentic prompts depend on the
    outputs of earlier turns)."""

    def __init__(self):
        self.ids: dict[tuple[int, ...], int] = {}
        self.by_id: list[list[int]] = []
        self.max_tokens: dict[int, int] = {}

    def add(self, ids: list[int], max_tokens: int) -> int:
        key = tuple(ids)
        if key not in self.ids:
            self.ids[key] = len(self.by_id)
            self.by_id.append(list(ids))
        pid = self.ids[key]
        self.max_tokens[pid] = max(self.max_tokens.get(pid, 0), max_tokens)
        return pid


def completion_body(ids, max_tokens: int, stream: bool) -> dict:
    body = {
        "model": "tiny",
        "prompt": ids,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "logprobs": 0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _absorb(rec: Record, data: dict) -> None:
    for choice in data.get("choices") or []:
        rec.tokens += choice.get("token_ids") or []
        rec.logprobs += (choice.get("logprobs") or {}).get("token_logprobs") or []
        rec.finish_reason = choice.get("finish_reason") or rec.finish_reason
    usage = data.get("usage") or {}
    rec.cached_tokens = (usage.get("prompt_tokens_details") or {}).get(
        "cached_tokens"
    ) or rec.cached_tokens


async def complete(
    session: aiohttp.ClientSession,
    base: str,
    rec: Record,
    ids: list[int],
    abort_after: int = 0,
    timeout: float = 300,
) -> Record:
    """One completion; abort_after > 0 drops the stream after that many
    events."""
    t0 = time.monotonic()
    body = completion_body(ids, rec.max_tokens, rec.stream)
    try:
        async with session.post(
            f"{base}/v1/completions",
            json=body,
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as resp:
            rec.status = resp.status
            if resp.status != 200:
                rec.error = (await resp.text())[:300]
            elif not rec.stream:
                _absorb(rec, await resp.json())
            else:
                events = 0
                async for raw in resp.content:
                    line = raw.decode().strip()
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    data = json.loads(line[6:])
                    if "error" in data:
                        rec.error = json.dumps(data["error"])[:300]
                    _absorb(rec, data)
                    events += 1
                    if abort_after and events >= abort_after:
                        rec.aborted = True
                        break  # leaving the block closes the connection
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        rec.error = f"{type(e).__name__}: {e}"[:300]
    rec.latency_s = time.monotonic() - t0
    return rec


BAD_KINDS = ("too_long", "bad_sampling", "malformed_json", "unknown_model")


async def bad_request(session, base: str, kind: str) -> Record:
    rec = Record(kind=f"bad:{kind}")
    t0 = time.monotonic()
    body: dict | bytes = completion_body([5, 6, 7], 4, False)
    if kind == "too_long":
        body["prompt"] = prompt(MAX_MODEL_LEN + 16, seed=1)
    elif kind == "bad_sampling":
        body["temperature"] = -1.0
    elif kind == "unknown_model":
        body["model"] = "no-such-model"
    else:
        body = b'{"model": "tiny", "prompt": [5, 6'
    kwargs = {"data": body} if isinstance(body, bytes) else {"json": body}
    try:
        async with session.post(
            f"{base}/v1/completions",
            headers={"Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=60),
            **kwargs,
        ) as resp:
            rec.status = resp.status
            text = await resp.text()
            try:
                data = json.loads(text)
                err = data.get("error", data)
                rec.error = str(err.get("message") if isinstance(err, dict) else err)
            except (ValueError, AttributeError):
                rec.error = text
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        rec.error = f"no response: {type(e).__name__}: {e}"
    rec.latency_s = time.monotonic() - t0
    return rec


def connector() -> aiohttp.TCPConnector:
    """The clients' connection pool: a new connection per request. vLLM's
    server closes a keep-alive connection after VLLM_HTTP_TIMEOUT_KEEP_ALIVE
    (5 s) idle, and a request sent on a pooled connection the server is
    closing fails without an answer ("Can not write request body", "Server
    disconnected"; no 5xx, no traceback in the server's log). Keeping idle
    connections 2 s on the client side was not enough: on a loaded 2-core
    machine the client's own event loop can lag seconds behind the server's
    clock (two such failures in one CI soak). The soak judges the server, not
    keep-alive races, so it does not reuse connections."""
    return aiohttp.TCPConnector(limit=CLIENTS * 2, force_close=True)


class Load:
    """CLIENTS concurrent clients until the deadline: agentic sessions (each
    turn extends the last prompt with its output and a new message), few-shot
    questions behind two shared prefixes, long generations, streaming or not,
    some dropped mid-stream, some malformed."""

    def __init__(self, base: str, prompts: Prompts, seed: int, deadline: float):
        self.base, self.prompts, self.deadline = base, prompts, deadline
        self.rng = random.Random(seed)
        self.records: list[Record] = []

    def _request(self, kind: str, max_tokens: int) -> tuple[Record, int]:
        stream = self.rng.random() < 0.5
        abort_after = 0
        if self.rng.random() < ABORT_FRACTION:
            stream, abort_after = True, self.rng.randint(1, 4)
        return Record(kind=kind, max_tokens=max_tokens, stream=stream), abort_after

    async def _session(self, http, s: int) -> None:
        ids = SYSTEM + prompt(64, seed=8000 + s)
        for t in range(NUM_TURNS):
            if time.monotonic() > self.deadline:
                return
            ids = ids + prompt(TURN_TOKENS, seed=9000 + 100 * s + t)
            rec, abort_after = self._request("agentic", TURN_OUTPUT)
            rec.prompt_id = self.prompts.add(ids, TURN_OUTPUT)
            self.records.append(await complete(http, self.base, rec, ids, abort_after))
            if rec.aborted or rec.status != 200 or len(rec.tokens) != TURN_OUTPUT:
                return  # the session ends with a dropped or failed turn
            ids = ids + rec.tokens

    async def _few_shot(self, http) -> None:
        ids = self.rng.choice(FEW_SHOT) + prompt(
            QUESTION_TOKENS, seed=9500 + self.rng.randrange(NUM_QUESTIONS)
        )
        rec, abort_after = self._request("few_shot", ANSWER_TOKENS)
        rec.prompt_id = self.prompts.add(ids, ANSWER_TOKENS)
        self.records.append(await complete(http, self.base, rec, ids, abort_after))

    async def _long(self, http) -> None:
        ids = SYSTEM + prompt(64, seed=8000 + self.rng.randrange(NUM_SESSIONS))
        rec, abort_after = self._request("long", LONG_OUTPUT)
        rec.prompt_id = self.prompts.add(ids, LONG_OUTPUT)
        self.records.append(await complete(http, self.base, rec, ids, abort_after))

    async def _client(self, http, i: int) -> None:
        if i < PREEMPTING_CLIENTS:
            await self._long(http)
        while time.monotonic() < self.deadline:
            r = self.rng.random()
            if r < BAD_FRACTION:
                kind = BAD_KINDS[self.rng.randrange(len(BAD_KINDS))]
                self.records.append(await bad_request(http, self.base, kind))
            elif r < 0.55:
                await self._session(http, self.rng.randrange(NUM_SESSIONS))
            elif r < 0.67:
                await self._long(http)
            else:
                await self._few_shot(http)

    async def run(self) -> list[Record]:
        async with aiohttp.ClientSession(connector=connector()) as http:
            await asyncio.gather(*(self._client(http, i) for i in range(CLIENTS)))
        return self.records


def server_processes(proc) -> dict[str, psutil.Process]:
    """API server, engine core and workers of a server, by role."""
    out = {}
    for p in group_processes(proc.pid):
        try:
            name = "api_server" if p.pid == proc.pid else p.name()
        except psutil.NoSuchProcess:
            continue
        if "resource_tracker" in " ".join(p.cmdline()):
            continue
        out[name if name not in out else f"{name}.{p.pid}"] = p
    return out


def rss_mib(procs: dict[str, psutil.Process]) -> dict[str, float]:
    out = {}
    for name, p in procs.items():
        try:
            out[name] = round(p.memory_info().rss / 2**20, 1)
        except psutil.NoSuchProcess:
            pass
    return out


def scrape(base: str) -> dict[str, float]:
    return samples(requests.get(f"{base}/metrics", timeout=30).text)[0]


async def sampler(base, procs, records, out: list, stop: asyncio.Event):
    """Every 5 s: requests answered so far, resident memory, two gauges."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        try:
            values = await loop.run_in_executor(None, scrape, base)
        except requests.RequestException:
            values = {}
        out.append(
            {
                "t": time.monotonic(),
                "requests": len(records),
                "rss_mib": rss_mib(procs),
                "cpu_cache_usage": values.get("vllm:kv_offload_cpu_cache_usage_perc"),
                "running": values.get("vllm:num_requests_running"),
            }
        )
        try:
            await asyncio.wait_for(stop.wait(), 5)
        except asyncio.TimeoutError:
            pass


async def load_with_samples(base, procs, prompts, spec: RunSpec, seed: int):
    load = Load(base, prompts, seed, time.monotonic() + spec.seconds)
    memory: list[dict] = []
    stop = asyncio.Event()
    task = asyncio.create_task(sampler(base, procs, load.records, memory, stop))
    records = await load.run()
    stop.set()
    await task
    return records, memory


def wait_drained(base: str, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = scrape(base)
        if not v.get("vllm:num_requests_running") and not v.get(
            "vllm:num_requests_waiting"
        ):
            return True
        time.sleep(1)
    return False


def read_audit(base: str, path: Path) -> dict | None:
    """The manager's ledger once idle: two short requests register with the
    request file present (the first also flushes completions still queued)."""
    trigger = Path(f"{path}.request")
    trigger.touch()
    try:
        for i in range(2):
            requests.post(
                f"{base}/v1/completions",
                json=completion_body(prompt(5, seed=90 + i), 1, False),
                timeout=60,
            ).raise_for_status()
    finally:
        trigger.unlink()
    return json.loads(path.read_text()) if path.exists() else None


async def shutdown_under_load(base: str, proc) -> dict:
    """SIGTERM to the API server's PID with SHUTDOWN_REQUESTS long requests
    running (half streaming): the server must exit within SHUTDOWN_BOUND_S and
    every client must have an answer (finished, aborted or an error)."""
    async with aiohttp.ClientSession(connector=connector()) as http:
        recs = [
            Record(kind="shutdown", max_tokens=1000, stream=i % 2 == 0)
            for i in range(SHUTDOWN_REQUESTS)
        ]
        tasks = [
            asyncio.create_task(
                complete(http, base, r, prompt(900, seed=600 + i), timeout=300)
            )
            for i, r in enumerate(recs)
        ]
        await asyncio.sleep(6)
        running = sum(not t.done() for t in tasks)
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        exited_s = None
        while time.monotonic() - t0 < SHUTDOWN_BOUND_S:
            if proc.poll() is not None:
                exited_s = time.monotonic() - t0
                break
            await asyncio.sleep(0.2)
        left = time.monotonic() - t0
        done, pending = await asyncio.wait(
            tasks, timeout=max(1.0, SHUTDOWN_BOUND_S + 5 - left)
        )
        answered_s = time.monotonic() - t0
        for t in pending:
            t.cancel()
    return {
        "in_flight_at_sigterm": running,
        "exit_s": None if exited_s is None else round(exited_s, 2),
        "clients_answered": len(done),
        "clients_hanging": len(pending),
        "answered_within_s": round(answered_s, 2),
        "outcomes": [
            {
                "stream": r.stream,
                "status": r.status,
                "finish_reason": r.finish_reason,
                "tokens": len(r.tokens),
                "error": r.error[:120],
            }
            for r in recs
        ],
    }


def _slope(points: list[tuple[int, float]]) -> float | None:
    """MiB per 1,000 requests (least squares), None with too few samples."""
    if len(points) < 3 or points[-1][0] == points[0][0]:
        return None
    return round(statistics.linear_regression(*zip(*points)).slope * 1000, 2)


def memory_growth(memory: list[dict], total: int) -> dict:
    """Resident memory per process: after warm-up, MiB per 1,000 requests,
    over all the samples and over their second half (a warm-up slows down,
    a leak does not)."""
    warm = [m for m in memory if m["requests"] >= total * MEMORY_WARMUP_FRACTION]
    out = {}
    for name in memory[-1]["rss_mib"] if memory else []:
        pts = [
            (m["requests"], m["rss_mib"][name]) for m in warm if name in m["rss_mib"]
        ]
        first = next((m["rss_mib"][name] for m in memory if name in m["rss_mib"]), 0)
        out[name] = {
            "start_mib": first,
            "warm_mib": pts[0][1] if pts else None,
            "end_mib": memory[-1]["rss_mib"].get(name),
            "mib_per_1000_requests": _slope(pts),
            "late_mib_per_1000_requests": _slope(pts[len(pts) // 2 :]),
        }
    return out


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def soak_run(spec: RunSpec, model, prompts: Prompts, out_dir: Path, seed: int):
    """One server under load, then its audit and its shutdown."""
    kwargs, extra = model_args(spec.model)
    audit_path = out_dir / f"{spec.name}.audit.json"
    audit_path.unlink(missing_ok=True)
    transfer = (
        kv_transfer_config(
            cpu_bytes_to_use=spec.cpu_bytes or CPU_BYTES[spec.model],
            eviction_policy=spec.policy,
            host_copy_audit_path=str(audit_path),
            **({"host_copy_corrupt_loads": True} if spec.corrupt_loads else {}),
        )
        if spec.connector
        else {}
    )
    retention = "None" if spec.retention is None else str(spec.retention)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = out_dir / f"{spec.name}.log"
    cmd = serve_command(
        model.path, port,
        "--prefix-cache-retention-interval", retention,
        *extra,
        kv_cache_bytes=KV_CACHE_BYTES[spec.model], kv_transfer=transfer, **kwargs,
    )  # fmt: skip
    proc = start_server(cmd, serve_env(**SERVER_ENV), log_path)
    result: dict = {"spec": asdict(spec)}
    records: list[Record] = []
    try:
        t0 = time.monotonic()
        try:
            wait_healthy(proc, base, log_path)
        except ServerError as e:
            # A server that does not start fails its run, not the whole soak.
            result["startup_error"] = str(e).splitlines()[0]
            print(f"  {spec.name}: {result['startup_error']}")
        if "startup_error" not in result:
            result["startup_s"] = round(time.monotonic() - t0, 1)
            procs = server_processes(proc)
            print(
                f"  {spec.name}: up in {result['startup_s']} s, load {spec.seconds:.0f} s"
            )
            records, memory = asyncio.run(
                load_with_samples(base, procs, prompts, spec, seed)
            )
            result["alive_after_load"] = proc.poll() is None
            result["drained"] = result["alive_after_load"] and wait_drained(base)
            if result["drained"]:
                result["audit"] = read_audit(base, audit_path)
                result["metrics"] = {
                    k: v for k, v in scrape(base).items() if k.startswith("vllm:")
                }
            result["memory"] = memory_growth(memory, len(records))
            result["memory_samples"] = memory
            result["cpu_cache_usage_max"] = max(
                (m["cpu_cache_usage"] or 0 for m in memory), default=None
            )
            if result["alive_after_load"]:
                result["shutdown"] = asyncio.run(shutdown_under_load(base, proc))
    finally:
        kill_group(proc)
    log = read_log(log_path)
    result["log_tracebacks"] = log.count("Traceback (most recent call last)")
    result["log_preemption_lines"] = log.count("preempt")
    result["records"] = [asdict(r) for r in records]
    return result


def reference(model, prompts: Prompts) -> dict[int, Record]:
    """Each distinct prompt once, greedy, on an in-process engine without the
    connector (same model and engine settings, a KV cache that needs no
    preemption)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from e2e.engine_utils import engine_kwargs, running_engine

    pids = range(len(prompts.by_id))
    params = [
        SamplingParams(
            max_tokens=prompts.max_tokens[p],
            temperature=0.0,
            ignore_eos=True,
            logprobs=2,  # the runner-up too: its margin tells a near tie
        )
        for p in pids
    ]
    with running_engine(**engine_kwargs(model, connector=False)) as llm:
        outs = llm.generate(
            [TokensPrompt(prompt_token_ids=prompts.by_id[p]) for p in pids],
            params,
            use_tqdm=False,
        )
    refs = {}
    for pid, out in zip(pids, outs):
        comp = out.outputs[0]
        chosen = [lp[t].logprob for t, lp in zip(comp.token_ids, comp.logprobs)]
        margins = [
            c - max((v.logprob for k, v in lp.items() if k != t), default=-1e9)
            for c, t, lp in zip(chosen, comp.token_ids, comp.logprobs)
        ]
        refs[pid] = Record(
            "reference",
            pid,
            len(comp.token_ids),
            tokens=list(comp.token_ids),
            logprobs=chosen,
            margins=margins,
        )
    return refs


def check(results: list[dict], refs: dict[str, dict], quick: bool) -> list[str]:
    """The soak's assertions; returns what failed."""
    fails = []
    for res in results:
        name = RunSpec(**res["spec"]).name
        recs = [Record(**r) for r in res["records"]]

        def fail(msg, name=name):
            fails.append(f"{name}: {msg}")

        if res.get("startup_error"):
            fail(f"the server did not start ({res['startup_error']})")
            continue

        if not res.get("alive_after_load"):
            fail("the server died under load")
        if not res.get("drained"):
            fail("requests still running 60 s after the load stopped")
        for r in recs:
            if r.kind.startswith("bad:"):
                if not (400 <= r.status < 500 and r.error.strip()):
                    fail(f"{r.kind}: status {r.status}, message {r.error!r}")
            elif r.status >= 500 or (r.status == 0 and not r.aborted):
                fail(f"{r.kind}: status {r.status} {r.error}")
            elif r.status == 200 and not r.aborted and r.error:
                fail(f"{r.kind}: error in a 200 stream: {r.error}")
        model = res["spec"]["model"]
        ref, tie = refs[model], TIE_MARGIN[model]
        share = BF16_DIVERGENCE_SHARE.get(model)
        gaps, ties, parted, completed = [], 0, [], 0
        for r in recs:
            if r.kind.startswith("bad:") or r.aborted or r.status != 200:
                continue
            want = ref[r.prompt_id]
            if len(r.tokens) != r.max_tokens:
                fail(f"prompt {r.prompt_id}: {len(r.tokens)} of {r.max_tokens} tokens")
                continue
            completed += 1
            same = next(
                (i for i, (a, b) in enumerate(zip(r.tokens, want.tokens)) if a != b),
                len(r.tokens),
            )
            if same < len(r.tokens):
                if want.margins[same] > tie:
                    what = (
                        f"prompt {r.prompt_id}: token {same} differs from the "
                        f"reference (its margin {want.margins[same]:.3g} > {tie})"
                    )
                    if share is None:
                        fail(what)
                    else:
                        parted.append(what)
                    continue
                ties += 1
            if model == "gemma":  # up to a near tie, where the tokens part
                pairs = zip(r.logprobs[:same], want.logprobs)
                gaps.append(max((abs(a - b) for a, b in pairs), default=0.0))
        res["near_tie_divergences"] = ties
        res["divergences"] = len(parted)
        res["completed_compared"] = completed
        if share is not None and len(parted) > share * completed:
            fail(
                f"{len(parted)} of {completed} completed requests part from the "
                f"reference past a near tie (more than {share:.0%})"
            )
            for what in parted:
                fail(what)
        res["max_logprob_gap"] = max(gaps, default=None)
        if gaps and max(gaps) > LOGPROB_ATOL:
            fail(f"logprob gap {max(gaps):.2e} > {LOGPROB_ATOL}")
        m = res.get("metrics", {})
        audit = res.get("audit") or {}
        counts = audit.get("counts", {})
        if not m.get("vllm:external_prefix_cache_hits_total"):
            fail("no offload hit")
        if not (counts.get("keys_evicted") or counts.get("stores_refused")):
            fail("the CPU tier neither evicted nor refused a store")
        if not m.get("vllm:num_preemptions_total"):
            fail("no preemption")
        if not audit:
            fail("no audit of the offload manager")
        else:
            for key in (
                "pending_store_keys",
                "manager_write_pending_blocks",
                "pending_load_keys",
                "stored_not_loadable",
                "leaked_host_blocks",
            ):
                if audit[key]:
                    fail(f"audit: {key} = {audit[key]}")
            if counts.get("evicted_not_stored"):
                fail(f"audit: evicted_not_stored = {counts['evicted_not_stored']}")
            if audit["evictable_blocks"] != audit["stored_keys"]:
                fail(
                    f"audit: {audit['evictable_blocks']} evictable blocks, "
                    f"{audit['stored_keys']} stored"
                )
            expected = res.get("expected_store_bytes")
            stored = m.get("vllm:kv_offload_store_bytes_total")
            if expected is not None and stored != expected:
                fail(f"store bytes {stored} in /metrics, {expected} in the ledger")
        sd = res.get("shutdown")
        if sd is None:
            fail("no shutdown test (server not alive)")
        else:
            if sd["exit_s"] is None:
                fail(f"still running {SHUTDOWN_BOUND_S} s after SIGTERM")
            if sd["clients_hanging"]:
                fail(f"{sd['clients_hanging']} clients without an answer")
        if res["log_tracebacks"]:
            fail(f"{res['log_tracebacks']} tracebacks in the server log")
        if not quick:
            for proc_name, g in res.get("memory", {}).items():
                slope = g["mib_per_1000_requests"]
                if slope is not None and slope > MEMORY_GROWTH_BOUND_MIB:
                    fail(f"{proc_name} grows {slope} MiB per 1,000 requests")
    return fails


def ledger_store_bytes(model, audit: dict | None) -> int | None:
    """What the workers must have reported for the stores the ledger
    completed: one block of its group per key (blocks_per_chunk 1)."""
    if not audit or model.mamba_layers:
        return None  # the Mamba hybrid's group order is vLLM's choice: not modelled
    # Full attention and sliding window: as many layers, the same page.
    assert model.full_layers == model.swa_layers
    keys = sum(audit["stored_keys_per_group"].values())
    return keys * model.full_layers * model.attn_page_bytes()


def summarize(res: dict) -> dict:
    recs = [Record(**r) for r in res["records"]]
    done = [r for r in recs if r.status == 200 and not r.aborted]
    m = res.get("metrics", {})
    counts = (res.get("audit") or {}).get("counts", {})
    return {
        "run": RunSpec(**res["spec"]).name,
        "load_s": res["spec"]["seconds"],
        "requests": len(recs),
        "completed": len(done),
        "aborted_by_client": sum(r.aborted for r in recs),
        "bad_by_kind": {k: sum(r.kind == f"bad:{k}" for r in recs) for k in BAD_KINDS},
        "bad_requests_refused": sum(
            r.kind.startswith("bad:") and 400 <= r.status < 500 for r in recs
        ),
        "failed": sum(
            r.status >= 500 or (r.status == 0 and not r.aborted) for r in recs
        ),
        "offload_hit_tokens": m.get("vllm:external_prefix_cache_hits_total"),
        "gpu_hit_tokens": m.get("vllm:prefix_cache_hits_total"),
        "preemptions": m.get("vllm:num_preemptions_total"),
        "keys_evicted": counts.get("keys_evicted", 0),
        "stores_refused": counts.get("stores_refused", 0),
        "store_bytes": m.get("vllm:kv_offload_store_bytes_total"),
        "skipped_bytes": m.get("vllm:kv_offload_retention_skipped_bytes_total"),
        "p50_s": percentile([r.latency_s for r in done], 0.5),
        "p99_s": percentile([r.latency_s for r in done], 0.99),
        "max_logprob_gap": res.get("max_logprob_gap"),
        "near_tie_divergences": res.get("near_tie_divergences"),
        "divergences": res.get("divergences"),
        "cpu_cache_usage_max": res.get("cpu_cache_usage_max"),
        "memory": res.get("memory"),
        "shutdown": {
            k: v for k, v in (res.get("shutdown") or {}).items() if k != "outcomes"
        },
    }


def machine() -> str:
    model, flags = "unknown CPU", ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model == "unknown CPU":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = line
    isa = (
        "AVX-512" if " avx512f" in flags else "AVX2" if " avx2" in flags else "no AVX2"
    )
    return f"{os.cpu_count()} cores ({model}, {isa})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one short run (~3 min)")
    ap.add_argument("--minutes", type=float, default=24, help="full run's load")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "soak")
    ap.add_argument("--report", type=Path, help="write the markdown report here")
    ap.add_argument("--only", nargs="+", help="runs to keep, e.g. granite-0-lru")
    ap.add_argument(
        "--control", action="store_true", help="the servers run without the connector"
    )
    ap.add_argument(
        "--corrupt-loads",
        action="store_true",
        help="negative control: the connector's loads write zeros",
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        help="only write --report from these summary.json files (a later "
        "file's run replaces an earlier one's of the same name)",
    )
    args = ap.parse_args(argv)
    if args.control and args.corrupt_loads:
        ap.error("--corrupt-loads needs the connector (not with --control)")
    if args.merge:
        from bench.soak_report import render

        # A run of a later file replaces the run of that name (and its
        # failures) from an earlier one.
        parts = [json.loads(p.read_text()) for p in args.merge]
        runs, fails = {}, {}
        for part in parts:
            for r in part["runs"]:
                runs[r["run"]] = r
                fails[r["run"]] = [
                    f for f in part["failures"] if f.startswith(r["run"] + ":")
                ]
        merged = {
            "command": "; ".join(p["command"] for p in parts),
            "machine": parts[0]["machine"],
            "quick": False,
            "wall_s": sum(p["wall_s"] for p in parts),
            "runs": list(runs.values()),
            "failures": [f for name in runs for f in fails[name]],
        }
        args.report.write_text(render(merged))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    specs = QUICK if args.quick else full_runs(args.minutes)
    if args.only:
        specs = [s for s in specs if s.name in args.only]
    if args.control:
        specs = [dataclasses.replace(s, connector=False) for s in specs]
    if args.corrupt_loads:
        specs = [dataclasses.replace(s, corrupt_loads=True) for s in specs]
    builders = {"gemma": gemma3_hybrid, "granite": granite_hybrid}
    models = {}
    t_start = time.monotonic()
    results: list[dict] = []
    refs: dict[str, dict] = {}
    for model_name in dict.fromkeys(s.model for s in specs):
        model = models[model_name] = builders[model_name](args.out / "models")
        prompts = Prompts()
        for i, spec in enumerate(s for s in specs if s.model == model_name):
            res = soak_run(spec, model, prompts, args.out, seed=i)
            res["expected_store_bytes"] = ledger_store_bytes(model, res.get("audit"))
            results.append(res)
            print("  " + json.dumps(summarize(res)))
        print(f"  {model_name}: reference for {len(prompts.by_id)} prompts")
        refs[model_name] = reference(model, prompts)
        (args.out / f"{model_name}.prompts.json").write_text(json.dumps(prompts.by_id))
    fails = check(results, refs, args.quick)
    summary = {
        "command": " ".join(
            ["scripts/soak.sh", *(argv if argv is not None else sys.argv[1:])]
        ),
        "machine": machine(),
        "quick": args.quick,
        "wall_s": round(time.monotonic() - t_start, 1),
        "runs": [summarize(r) for r in results],
        "failures": fails,
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    (args.out / "results.json").write_text(json.dumps(results))
    if args.report:
        from bench.soak_report import render

        args.report.write_text(render(summary))
    for f in fails:
        print(f"FAIL {f}")
    print(f"soak: {len(specs)} runs in {summary['wall_s']} s, {len(fails)} failures")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
