#!/usr/bin/env python3
"""Load generator for `gemmajit serve` (any OpenAI-compatible server): streaming chat requests
from concurrent clients, with time to first token and decode rates measured on the client side.

  python3 tools/serve_load.py --url http://127.0.0.1:8080 [--api-key KEY] [--streams 8]
                              [--max-tokens 256] [--long-prompt 512] [--reps 5]

Runs three measurements and prints one table (standard library only, so it runs on the GPU
machine as is):
  single     one stream of --max-tokens: its decode rate (tokens after the first / their time)
  aggregate  --streams streams started together, each --max-tokens: the sum of their decode rates
             while all of them run, and the total over the wall time
  ttft       --streams - 1 streams decoding, then a prompt of about --long-prompt tokens (one
             generated token; sized with /tokenize): its time to first token, --reps times,
             median (min..max)
Every request is greedy (temperature 0). A request that fails or ends without tokens is an error
(exit status 1), so a broken server never reports a rate.
"""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse


class Stream:
    """One streaming chat completion; records when each content chunk arrived."""

    def __init__(self, url, api_key, prompt, max_tokens):
        self.url, self.api_key = url, api_key
        self.prompt, self.max_tokens = prompt, max_tokens
        self.start = self.first = self.end = None
        self.chunk_times = []
        self.completion_tokens = 0
        self.prompt_tokens = 0
        self.error = None
        self.started = threading.Event()

    def run(self):
        try:
            self._run()
        except Exception as e:  # noqa: BLE001 - reported, never swallowed
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self.started.set()

    def _run(self):
        u = urllib.parse.urlparse(self.url)
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
        body = json.dumps({
            "model": "gemma", "stream": True, "temperature": 0, "max_tokens": self.max_tokens,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": self.prompt}]})
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        self.start = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body, headers)
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                self.completion_tokens = chunk["usage"]["completion_tokens"]
                self.prompt_tokens = chunk["usage"]["prompt_tokens"]
            for c in chunk.get("choices", []):
                if c.get("delta", {}).get("content") or c.get("delta", {}).get("reasoning_content"):
                    now = time.perf_counter()
                    if self.first is None:
                        self.first = now
                        self.started.set()
                    self.chunk_times.append(now)
        self.end = time.perf_counter()
        conn.close()
        if self.completion_tokens == 0 or self.first is None:
            raise RuntimeError("the stream ended without tokens")

    def ttft(self):
        return self.first - self.start

    def decode_rate(self):
        """Tokens after the first over the time from the first to the last chunk."""
        span = self.chunk_times[-1] - self.first
        return (self.completion_tokens - 1) / span if span > 0 else 0.0


def run_streams(streams):
    threads = [threading.Thread(target=s.run, daemon=True) for s in streams]
    for t in threads:
        t.start()
    return threads


def check(streams):
    bad = [s.error for s in streams if s.error]
    if bad:
        sys.exit(f"serve_load: {len(bad)} request(s) failed: {bad[0]}")


def prompt_of(words, tag):
    return f"Request {tag}. " + " ".join(f"word{i % 97}" for i in range(words))


def count_tokens(url, api_key, text):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=60)
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    conn.request("POST", "/tokenize", json.dumps({"content": text}), headers)
    resp = conn.getresponse()
    if resp.status != 200:
        sys.exit(f"serve_load: /tokenize answered HTTP {resp.status}")
    n = len(json.loads(resp.read())["tokens"])
    conn.close()
    return n


def prompt_of_tokens(url, api_key, target, tag):
    """A prompt of about `target` tokens with the chat format's (about 16 tokens) around it: the
    most words whose text tokenizes to at most target - 16 tokens."""
    lo, hi = 1, max(2, target)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_tokens(url, api_key, prompt_of(mid, tag)) <= target - 16:
            lo = mid
        else:
            hi = mid - 1
    return prompt_of(lo, tag)


def stats(values):
    return statistics.median(values), min(values), max(values)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--long-prompt", type=int, default=512, help="tokens of the ttft prompt")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    if a.streams < 2 or a.max_tokens < 2 or a.reps < 1:
        sys.exit("serve_load: --streams and --max-tokens must be >= 2, --reps >= 1")

    rows = []
    # Warm-up: every batch size the runs below use gets its decode graph captured.
    warm = [Stream(a.url, a.api_key, prompt_of(16, f"warm{i}"), 8) for i in range(a.streams)]
    for t in run_streams(warm):
        t.join()
    check(warm)

    single = Stream(a.url, a.api_key, prompt_of(16, "single"), a.max_tokens)
    run_streams([single])[0].join()
    check([single])
    rows.append(("single stream decode", f"{single.decode_rate():.1f} t/s",
                 f"{single.completion_tokens} tokens, ttft {single.ttft() * 1e3:.1f} ms"))

    many = [Stream(a.url, a.api_key, prompt_of(16, f"agg{i}"), a.max_tokens)
            for i in range(a.streams)]
    for t in run_streams(many):
        t.join()
    check(many)
    # The window where every stream was decoding: from the last first token to the first end.
    lo = max(s.first for s in many)
    hi = min(s.chunk_times[-1] for s in many)
    in_window = sum(sum(1 for t in s.chunk_times if lo <= t <= hi) for s in many)
    total = sum(s.completion_tokens for s in many)
    wall = max(s.end for s in many) - min(s.start for s in many)
    rows.append((f"aggregate decode, {a.streams} streams",
                 f"{in_window / (hi - lo):.1f} t/s" if hi > lo else "n/a",
                 f"sum of per-stream rates {sum(s.decode_rate() for s in many):.1f} t/s; "
                 f"{total} tokens in {wall:.2f} s wall = {total / wall:.1f} t/s"))

    ttfts = []
    for r in range(a.reps):
        background = [Stream(a.url, a.api_key, prompt_of(16, f"bg{r}.{i}"), a.max_tokens)
                      for i in range(a.streams - 1)]
        threads = run_streams(background)
        for s in background:
            s.started.wait()
        time.sleep(0.2)  # the background streams are decoding
        probe = Stream(a.url, a.api_key, prompt_of_tokens(a.url, a.api_key, a.long_prompt,
                                                          f"probe{r}"), 1)
        run_streams([probe])[0].join()
        for t in threads:
            t.join()
        check(background + [probe])
        ttfts.append(probe.ttft() * 1e3)
    med, mn, mx = stats(ttfts)
    rows.append((f"ttft, {probe.prompt_tokens}-token prompt while {a.streams - 1} decode",
                 f"{med:.1f} ms", f"({mn:.1f}..{mx:.1f}) over {a.reps}"))

    for name, value, note in rows:
        print(f"| {name:<44} | {value:>12} | {note} |")


if __name__ == "__main__":
    main()
