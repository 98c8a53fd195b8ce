"""What a long `bad_words` list costs a request, against the same request without it, on a
running server: `python scripts/bad_words_cost.py [--url URL] [--words N] [--repeats K]`.
Prints the median time of each over interleaved pairs, the time the list adds and the ratio (one token generated, so the list's one-off
cost — tokenizing every word twice, sending and indexing them — is what is measured)."""
import argparse
import json
import random
import statistics
import time
import urllib.request


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:3000")
    parser.add_argument("--words", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    draw = random.Random(7)
    words = ["".join(draw.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(draw.randint(3, 12)))
             for _ in range(args.words)]

    def seconds(body: dict) -> float:
        request = urllib.request.Request(f"{args.url}/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        started = time.perf_counter()
        urllib.request.urlopen(request, timeout=300).read()
        return time.perf_counter() - started

    base = {"prompt": "The capital of France is", "max_tokens": 1, "temperature": 0}
    listed = {**base, "bad_words": words}
    seconds(base), seconds(listed)
    pairs = []
    for repeat in range(args.repeats):
        # Interleaved pairs, the order alternating.
        if repeat % 2:
            banned, plain = seconds(listed), seconds(base)
        else:
            plain, banned = seconds(base), seconds(listed)
        pairs.append((plain, banned))
    plain = statistics.median(p for p, _ in pairs)
    banned = statistics.median(b for _, b in pairs)
    extra = sorted(b - p for p, b in pairs)
    print(f"one token, {args.repeats} interleaved pairs, medians: plain {plain:.3f} s, {args.words} bad words "
          f"{banned:.3f} s; the list adds {statistics.median(extra):.3f} s (range {extra[0]:.3f}-{extra[-1]:.3f}), "
          f"{banned / plain:.1f}x")


if __name__ == "__main__":
    main()
