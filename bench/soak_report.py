# SPDX-License-Identifier: Apache-2.0
"""bench/results/soak.md from a soak's summary (python -m bench.soak --report)."""


def render(summary: dict) -> str:
    return "```json\n" + __import__("json").dumps(summary, indent=1) + "\n```\n"
