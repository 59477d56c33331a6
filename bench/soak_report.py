# SPDX-License-Identifier: Apache-2.0
"""bench/results/soak.md from a soak's summary (python -m bench.soak --report)."""


def _fmt(value, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and digits:
        return f"{value:,.{digits}f}"
    return f"{int(value):,}"


RUN_COLUMNS = [
    ("requests", "requests", 0),
    ("completed", "completed", 0),
    ("aborted by client", "aborted_by_client", 0),
    ("bad, refused 4xx", "bad_requests_refused", 0),
    ("failed (5xx, no answer)", "failed", 0),
    ("offload hit tokens", "offload_hit_tokens", 0),
    ("GPU hit tokens", "gpu_hit_tokens", 0),
    ("preemptions", "preemptions", 0),
    ("CPU keys evicted", "keys_evicted", 0),
    ("stores refused", "stores_refused", 0),
    ("store MB", "store_mb", 1),
    ("skipped MB", "skipped_mb", 1),
    ("p50 s", "p50_s", 2),
    ("p99 s", "p99_s", 2),
    ("near-tie divergences", "near_tie_divergences", 0),
    ("other divergences (bf16)", "divergences", 0),
]


def render(summary: dict) -> str:
    runs = summary["runs"]
    for r in runs:
        for key in ("store", "skipped"):
            b = r.get(f"{key}_bytes")
            r[f"{key}_mb"] = None if b is None else b / 1e6
    lines = [
        "# Soak: `vllm serve` with a bounded offload tier",
        "",
        f"`{summary['command']}` on {summary['machine']}, "
        f"{summary['wall_s'] / 60:.1f} min in all "
        f"({sum(r['load_s'] for r in runs) / 60:.1f} min of load).",
        "",
        "Each run: one server (engine core in its own process, the "
        "OffloadingConnector with the host-copy spec and vLLM's "
        "CPUOffloadingManager), 8 clients (agentic sessions, few-shot prompts "
        "behind two shared prefixes, long generations; half streaming, 15% "
        "dropped mid-stream, 6% malformed), then the manager's ledger once "
        "idle, then SIGTERM to the API server with 4 long requests in flight. "
        "Every completed request is compared with an engine without the "
        "connector (bench/soak.py has the assertions).",
        "",
        "| run | " + " | ".join(c[0] for c in RUN_COLUMNS) + " |",
        "|---|" + "---:|" * len(RUN_COLUMNS),
    ]
    for r in runs:
        cells = [_fmt(r.get(key), digits) for _, key, digits in RUN_COLUMNS]
        lines.append(f"| {r['run']} | " + " | ".join(cells) + " |")
    totals = [
        _fmt(sum(r.get(key) or 0 for r in runs)) if not digits else ""
        for _, key, digits in RUN_COLUMNS
    ]
    lines.append("| **all** | " + " | ".join(totals) + " |")
    bad = {k: sum(r["bad_by_kind"][k] for r in runs) for k in runs[0]["bad_by_kind"]}
    lines += [
        "",
        "Bad requests sent, by kind: "
        + ", ".join(f"{k.replace('_', ' ')} {n:,}" for k, n in bad.items())
        + "; each must get a 4xx with a message.",
    ]
    lines += [
        "",
        "Max logprob gap against the reference (fp32 Gemma, up to a near "
        "tie): "
        + ", ".join(
            f"{r['run']} {r['max_logprob_gap']:.1e}"
            for r in runs
            if r.get("max_logprob_gap") is not None
        )
        + ".",
        "",
        "## Shutdown (SIGTERM to the API server, requests in flight)",
        "",
        "| run | in flight | exit s | clients answered | hanging |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in runs:
        sd = r.get("shutdown") or {}
        lines.append(
            f"| {r['run']} | {_fmt(sd.get('in_flight_at_sigterm'))} | "
            f"{_fmt(sd.get('exit_s'), 2)} | {_fmt(sd.get('clients_answered'))} | "
            f"{_fmt(sd.get('clients_hanging'))} |"
        )
    lines += [
        "",
        "## Resident memory",
        "",
        "Per process: at the first sample, after warm-up (a quarter of the "
        "run's requests), at the end, and the growth after warm-up (least "
        "squares over 5 s samples), also over the second half of those "
        "samples only (a warm-up slows down, a leak does not).",
        "",
        "| run | process | start MiB | warm MiB | end MiB "
        "| MiB / 1,000 requests | second half |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        for name, m in (r.get("memory") or {}).items():
            lines.append(
                f"| {r['run']} | {name} | {_fmt(m['start_mib'], 1)} | "
                f"{_fmt(m['warm_mib'], 1)} | {_fmt(m['end_mib'], 1)} | "
                f"{_fmt(m['mib_per_1000_requests'], 2)} | "
                f"{_fmt(m['late_mib_per_1000_requests'], 2)} |"
            )
    lines += ["", "## Failures", ""]
    lines += [f"- {f}" for f in summary["failures"]] or ["None."]
    return "\n".join(lines) + "\n"
