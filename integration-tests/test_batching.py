"""Continuous batching must not change results: 32 concurrent greedy requests (a few with
prompts long enough to be prefilled in chunks) give exactly what each gives alone."""
from concurrent.futures import ThreadPoolExecutor

import requests

TOPICS = [
    "rivers", "volcanoes", "bread", "chess", "owls", "glaciers", "violins", "tea", "comets",
    "bridges", "honeybees", "deserts", "lighthouses", "maps", "octopuses", "clocks", "coral",
    "trains", "paper", "thunder", "gardens", "kites", "salt", "mirrors", "wolves", "islands",
    "candles", "rain", "mountains", "bicycles", "libraries", "whales",
]
MAX_NEW_TOKENS = 8


def prompt(index: int, topic: str) -> str:
    text = f"Write one sentence about {topic}."
    if index % 8 == 0:
        # ~400 tokens: with --max-batch-tokens 1024 and 31 other prompts this is chunked.
        text = f"Here are some notes on {topic}. " + "They matter for many reasons. " * 60 + text
    return text


def generate(url: str, text: str) -> list[int]:
    body = {"inputs": text, "parameters": {"max_new_tokens": MAX_NEW_TOKENS, "details": True}}
    response = requests.post(f"{url}/generate", json=body, timeout=300)
    response.raise_for_status()
    return [token["id"] for token in response.json()["details"]["tokens"]]


def test_concurrent_greedy_requests_match_their_solo_runs(url):
    prompts = [prompt(index, topic) for index, topic in enumerate(TOPICS)]
    alone = [generate(url, text) for text in prompts]
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        together = list(pool.map(lambda text: generate(url, text), prompts))
    mismatches = [i for i, (a, b) in enumerate(zip(alone, together)) if a != b]
    assert not mismatches, f"batched outputs differ for prompts {mismatches}"
    assert all(len(tokens) >= 1 for tokens in alone)
