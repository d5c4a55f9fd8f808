#!/usr/bin/env python3
"""Time to first token through `exlagent serve` over HTTP for a suffix on a cached prefix.

Starts the server on a model, sends one /v1/completions request whose text prompt is a long
prefix plus a suffix (cold), then several with the same prefix and new suffixes (warm, the
prefix's pages cached), each non-streamed with max_tokens 1, and prints each request's wall time
as the client sees it (connect to last byte), the usage the server reports and the server's own
mean TTFT (submit to first token) and request preparation time (read to submit), from /metrics. The prefix is common words, one token each on
the llama tokenizers; a first request of the prefix alone measures its token count, and the
prefix is trimmed to --prefix-tokens (with the bos token) so that whole pages of it are cached.

  tests/gpu/serve_prefix_ttft.py --exlagent build/exlagent --model DIR [--backend cuda]
      [--prefix-tokens 4096] [--suffix-words 64] [--warm 8]
"""
import argparse
import json
import random
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

WORDS = ("the of and to in is was for on that with as by at from his her they this had not are but "
         "have one were all their when there which she been more would will into time two first some "
         "could other than then them these so can only over new after also most made may about its "
         "many before must through back years where much your way well down should because each just "
         "those people how too little state good very make world still own see men work long get here "
         "between both life being under never day same another know while last might great old year "
         "off come since against go came right used take three").split()


FAMILIES = {"time_to_first_token": "TTFT (submit to first token)",
            "request_preparation": "preparation (request read to submit)"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def text(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as r:
        reply = json.loads(r.read())
    return time.perf_counter() - t0, reply


def first_byte(port, body):
    """Seconds to the first streamed content chunk (data: line with text) of a streamed request."""
    body = dict(body, stream=True)
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first = None
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            if first is None and line.startswith(b"data: {") and b'"text"' in line:
                first = time.perf_counter() - t0
    return first, time.perf_counter() - t0


def histogram(port, family):
    """(sum, count) of one of the server's histograms."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    vals = {}
    for line in text.splitlines():
        if line.startswith("#") or family not in line:
            continue
        name, _, value = line.rpartition(" ")
        name = name.split("{")[0]
        if name.endswith("_sum") or name.endswith("_count"):
            vals[name.rsplit("_", 1)[1]] = float(value)
    return vals.get("sum", 0.0), vals.get("count", 0.0)


def usage_text(reply):
    u = reply.get("usage") or {}
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
    return f"prompt {u.get('prompt_tokens')} tokens, {cached} cached"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exlagent", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--prefix-tokens", type=int, default=4096)
    ap.add_argument("--suffix-words", type=int, default=64)
    ap.add_argument("--warm", type=int, default=8)
    a = ap.parse_args()
    port = free_port()
    srv = subprocess.Popen([a.exlagent, "serve", "--model", a.model, "--backend", a.backend, "--port", str(port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 600
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                if srv.poll() is not None or time.time() > deadline:
                    sys.exit("server did not start: " + (srv.stderr.read() if srv.poll() is not None else "timeout"))
                time.sleep(0.5)
        rng = random.Random(7)
        words = [rng.choice(WORDS) for _ in range(a.prefix_tokens)]
        s, reply = post(port, {"prompt": " ".join(words), "max_tokens": 1, "temperature": 0})
        print(f"cold (the prefix alone) {s * 1000:.1f} ms, {usage_text(reply)}")
        extra = reply["usage"]["prompt_tokens"] - len(words)
        prefix = " ".join(words[:a.prefix_tokens - extra])
        times = []
        before = {f: histogram(port, f) for f in FAMILIES}
        for _ in range(a.warm):
            body = {"prompt": prefix + " " + text(rng, a.suffix_words), "max_tokens": 1, "temperature": 0}
            s, reply = post(port, body)
            print(f"warm {s * 1000:.1f} ms, {usage_text(reply)}")
            times.append(s * 1000)
        after = {f: histogram(port, f) for f in FAMILIES}
        health = []
        for _ in range(5):
            t0 = time.perf_counter()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
                r.read()
            health.append((time.perf_counter() - t0) * 1000)
        tiny = [post(port, {"prompt": "the", "max_tokens": 1, "temperature": 0})[0] * 1000 for _ in range(5)]
        streamed = [first_byte(port, {"prompt": prefix + " " + text(rng, a.suffix_words), "max_tokens": 1,
                                      "temperature": 0}) for _ in range(4)]
        print(f"GET /health median {statistics.median(health):.2f} ms; a 2-token prompt, max_tokens 1: median "
              f"{statistics.median(tiny):.1f} ms")
        print("streamed warm requests, first text chunk / end: " +
              ", ".join(f"{f * 1000:.1f} / {e * 1000:.1f} ms" for f, e in streamed if f is not None))
        print(f"warm median {statistics.median(times):.1f} ms, min {min(times):.1f} ms over {len(times)}")
        for f, what in FAMILIES.items():
            (s1, n1), (s0, n0) = after[f], before[f]
            if n1 > n0:
                print(f"server-side {what} (/metrics): mean {(s1 - s0) / (n1 - n0) * 1000:.2f} ms")
    finally:
        srv.terminate()
        _, err = srv.communicate(timeout=60)
        if err.strip():
            print("server stderr (last lines):\n" + "\n".join(err.strip().splitlines()[-20:]))


if __name__ == "__main__":
    main()
