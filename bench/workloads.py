# SPDX-License-Identifier: Apache-2.0
"""Seeded synthetic workloads (token ids only).

A workload is a list of rounds; the requests of a round are submitted together
and the next round starts when they have all finished. Each request is
``(prompt token ids, output token ids)``: the fake model emits exactly those
outputs, so a later turn can extend an earlier turn's prompt and output."""

import random

VOCAB = (100, 32000)

Request = tuple[list[int], list[int]]


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*VOCAB) for _ in range(n)]


def gsm8k(num_prompts: int = 200, seed: int = 0) -> list[list[Request]]:
    """One ~900-token 8-shot prefix shared by every prompt, a 40-80 token
    question (~60), 120-180 output tokens (~150). One round."""
    rng = random.Random(seed)
    prefix = _tokens(rng, 900)
    requests = [
        (
            prefix + _tokens(rng, rng.randint(40, 80)),
            _tokens(rng, rng.randint(120, 180)),
        )
        for _ in range(num_prompts)
    ]
    return [requests]


def agentic(
    num_sessions: int = 20, num_turns: int = 8, seed: int = 1
) -> list[list[Request]]:
    """A shared 4096-token system prompt; each session's first turn adds a
    100-300 token user message, each later turn appends the previous turn's
    output (100-300 tokens) and a 200-600 token tool result / user message.
    Round t holds turn t of every session."""
    rng = random.Random(seed)
    system = _tokens(rng, 4096)
    prompts = [
        system + _tokens(rng, rng.randint(100, 300)) for _ in range(num_sessions)
    ]
    rounds = []
    for _ in range(num_turns):
        outputs = [_tokens(rng, rng.randint(100, 300)) for _ in range(num_sessions)]
        rounds.append(list(zip(prompts, outputs)))
        prompts = [
            p + o + _tokens(rng, rng.randint(200, 600))
            for p, o in zip(prompts, outputs)
        ]
    return rounds


def longdoc(
    num_docs: int = 6, num_questions: int = 4, seed: int = 2
) -> list[list[Request]]:
    """Long-document QA: documents of 4-16k tokens (longer than Gemma-3's
    1024-token window), each asked num_questions 20-60 token questions in
    separate requests with 50-150 output tokens. Round q holds question q of
    every document."""
    rng = random.Random(seed)
    docs = [_tokens(rng, rng.randint(4096, 16384)) for _ in range(num_docs)]
    return [
        [
            (
                doc + _tokens(rng, rng.randint(20, 60)),
                _tokens(rng, rng.randint(50, 150)),
            )
            for doc in docs
        ]
        for _ in range(num_questions)
    ]


WORKLOADS = {"gsm8k": gsm8k, "agentic": agentic, "longdoc": longdoc}

DESCRIPTIONS = {
    "gsm8k": "GSM8K-like: 200 prompts = one shared 900-token 8-shot prefix + a "
    "40-80 token question; 120-180 output tokens each; all submitted at once",
    "agentic": "agentic multi-turn: 20 sessions x 8 turns on a shared 4096-token "
    "system prompt; turn t+1 = turn t prompt + its 100-300 output tokens + a "
    "200-600 token tool result; turns of all sessions run as one round",
    "longdoc": "long-document QA: 6 documents of 4-16k tokens, 4 questions of "
    "20-60 tokens each (separate requests, 50-150 output tokens); question q of "
    "every document runs as one round",
}
