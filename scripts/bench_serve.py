#!/usr/bin/env python3
"""Load test of a running `dsqwen serve` (standard library only, so it runs
on the GPU machine without network): C concurrent streaming clients, each
sending a prompt of exactly P token ids to /v1/completions and reading
N tokens (ignore_eos, so every reply has N tokens), all started together.

    python3 scripts/bench_serve.py --url http://127.0.0.1:8000 \\
        [--clients 64] [--prompt-len 512] [--max-tokens 256] [--waves 2] \\
        [--bench-tok-s X --bench-ms-step Y --bench-e2e-tok-s Z] [--json OUT.json]

Prints, for the last wave (the first ones warm the server up: CUDA graphs
per batch size, cuBLASLt algorithms):
  output tok/s   all completion tokens / (last reply done - first request sent)
  TTFT p50/p99   request sent -> first token chunk, per client
  ITL  p50/p99   gaps between successive token chunks, over all clients
With --bench-tok-s / --bench-ms-step (from `dsqwen bench` at the same batch
and context) it also prints the issue-13 targets: tok/s >= 85% of the
bench's, p99 ITL <= 2 x its step time.

Clients run as threads spread over several processes (one Python thread
cannot parse 10k+ SSE lines per second beside 63 others); each line's
arrival time is taken on CLOCK_MONOTONIC, which all processes share.
"""
import argparse
import http.client
import json
import multiprocessing as mp
import random
import sys
import threading
import time
import urllib.parse


def one_client(host, port, path, body, key, out, idx):
    try:
        c = http.client.HTTPConnection(host, port, timeout=600)
        h = {"Content-Type": "application/json"}
        if key:
            h["Authorization"] = "Bearer " + key
        t0 = time.monotonic()
        c.request("POST", path, body=body, headers=h)
        r = c.getresponse()
        if r.status != 200:
            out[idx] = {"error": f"HTTP {r.status}: {r.read()[:300]!r}"}
            return
        arrivals, usage, done = [], None, False
        for line in r:
            if not line.startswith(b"data: "):
                continue
            t = time.monotonic()
            payload = line[6:].strip()
            if payload == b"[DONE]":
                done = True
                break
            if b'"usage"' in payload and b'"choices":[]' in payload:
                usage = json.loads(payload)["usage"]
                continue
            arrivals.append(t)
        c.close()
        out[idx] = {"t0": t0, "arrivals": arrivals, "usage": usage, "done": done,
                    "t_end": time.monotonic()}
    except Exception as e:  # reported by the parent
        out[idx] = {"error": repr(e)}


def worker(args):
    host, port, path, key, bodies, start_at = args
    out = [None] * len(bodies)
    while time.monotonic() < start_at:  # every process starts together
        time.sleep(0.0005)
    ts = [threading.Thread(target=one_client, args=(host, port, path, b, key, out, i))
          for i, b in enumerate(bodies)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def pct(v, p):
    if not v:
        return float("nan")
    v = sorted(v)
    k = min(len(v) - 1, max(0, int(round(p / 100.0 * (len(v) - 1)))))
    return v[k]


def wave(a, host, port, seed):
    rng = random.Random(seed)
    bodies = []
    for i in range(a.clients):
        # distinct prompts (no prefix sharing unless --shared-prefix)
        shared = [((7 * k) % 29000) + 1000 for k in range(a.shared_prefix)]
        own = [rng.randrange(1000, 30000) for _ in range(a.prompt_len - a.shared_prefix)]
        bodies.append(json.dumps({"model": "x", "prompt": shared + own,
                                  "max_tokens": a.max_tokens, "ignore_eos": True,
                                  "temperature": a.temperature, "top_p": a.top_p,
                                  "seed": seed * 1000 + i, "stream": True,
                                  # logprobs make every token one chunk (a token
                                  # ending inside a UTF-8 character has no text
                                  # and would make no chunk of its own)
                                  "logprobs": None if a.no_logprobs else 0,
                                  "stream_options": {"include_usage": True}}).encode())
    n_proc = max(1, min(a.processes, a.clients))
    groups = [bodies[i::n_proc] for i in range(n_proc)]
    start_at = time.monotonic() + 0.5
    with mp.Pool(n_proc) as pool:
        res = pool.map(worker, [(host, port, "/v1/completions", a.api_key, g, start_at)
                                for g in groups])
    return [r for g in res for r in g]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--shared-prefix", type=int, default=0,
                    help="first N prompt tokens equal in every request (prefix cache)")
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--waves", type=int, default=2, help="the last one is measured")
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--no-logprobs", action="store_true",
                    help="do not ask for logprobs (chunks may then hold 0 or 2 tokens)")
    ap.add_argument("--bench-tok-s", type=float, default=None)
    ap.add_argument("--bench-ms-step", type=float, default=None)
    ap.add_argument("--bench-e2e-tok-s", type=float, default=None,
                    help="dsqwen bench's e2e_t/s: the same prompts and outputs, prefill included")
    ap.add_argument("--json", default=None, help="write the figures here")
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)
    host, port = u.hostname, u.port or 80

    for w in range(a.waves):
        res = wave(a, host, port, w + 1)
        errors = [r for r in res if not r or "error" in r or not r.get("done")]
        print(f"wave {w + 1}/{a.waves}: {len(res) - len(errors)} of {len(res)} replies complete",
              flush=True)
        for r in errors[:5]:
            print("  error:", r, flush=True)
    if errors:
        print("FAILED: some replies did not complete", flush=True)
        return 1
    t_start = min(r["t0"] for r in res)
    t_end = max(r["t_end"] for r in res)
    n_out = sum(r["usage"]["completion_tokens"] if r["usage"] else len(r["arrivals"])
                for r in res)
    ttft = [r["arrivals"][0] - r["t0"] for r in res if r["arrivals"]]
    itl = [b - a_ for r in res for a_, b in zip(r["arrivals"], r["arrivals"][1:])]
    # steady state: from the moment every client has its first token to the
    # moment the first one finishes, all of them decode; token chunks that
    # arrive in that window over its length is the decode rate comparable
    # with `dsqwen bench` (which times decode steps only)
    w0 = max(r["arrivals"][0] for r in res if r["arrivals"])
    w1 = min(r["arrivals"][-1] for r in res if r["arrivals"])
    n_win = sum(sum(1 for t in r["arrivals"] if w0 < t <= w1) for r in res)
    steady = n_win / (w1 - w0) if w1 > w0 else float("nan")
    fig = {
        "clients": a.clients, "prompt_len": a.prompt_len, "max_tokens": a.max_tokens,
        "output_tokens": n_out, "wall_s": t_end - t_start,
        "output_tok_s": n_out / (t_end - t_start),
        "steady_tok_s": steady, "steady_window_s": w1 - w0,
        "ttft_p50_ms": 1e3 * pct(ttft, 50), "ttft_p99_ms": 1e3 * pct(ttft, 99),
        "itl_p50_ms": 1e3 * pct(itl, 50), "itl_p99_ms": 1e3 * pct(itl, 99),
        "itl_max_ms": 1e3 * max(itl) if itl else float("nan"),
    }
    print(f"{a.clients} clients x ({a.prompt_len} prompt + {a.max_tokens} output) tokens: "
          f"{n_out} output tokens in {fig['wall_s']:.2f} s = {fig['output_tok_s']:.0f} tok/s")
    print(f"steady state (all {a.clients} decoding, {fig['steady_window_s']:.2f} s): "
          f"{steady:.0f} tok/s" + ("" if a.no_logprobs else " (one chunk per token)"))
    print(f"TTFT p50 {fig['ttft_p50_ms']:.1f} ms, p99 {fig['ttft_p99_ms']:.1f} ms; "
          f"inter-token p50 {fig['itl_p50_ms']:.2f} ms, p99 {fig['itl_p99_ms']:.2f} ms, "
          f"max {fig['itl_max_ms']:.2f} ms")
    ok = True
    if a.bench_tok_s:
        # the issue's target reads "total output tok/s >= 85% of dsqwen
        # bench"; the bench times decode only, so both ratios are printed
        r = fig["output_tok_s"] / a.bench_tok_s
        r2 = steady / a.bench_tok_s
        fig["vs_bench"] = r
        fig["steady_vs_bench"] = r2
        print(f"total output tok/s / dsqwen bench decode tok/s = {100 * r:.1f}% "
              f"(target >= 85%): {'met' if r >= 0.85 else 'NOT met'} (includes the prefill "
              f"of all {a.clients} prompts, which the bench does not time)")
        print(f"steady-state tok/s / dsqwen bench decode tok/s = {100 * r2:.1f}%")
        ok &= r >= 0.85
    if a.bench_e2e_tok_s:
        # the same work (B prompts prefilled, then every reply generated) as
        # the bench does it, one prompt at a time then B-wide steps: what
        # the server's own scheduling and HTTP path cost on top
        r = fig["output_tok_s"] / a.bench_e2e_tok_s
        fig["vs_bench_e2e"] = r
        print(f"total output tok/s / dsqwen bench e2e tok/s (prefill included) = {100 * r:.1f}%")
    if a.bench_ms_step:
        r = fig["itl_p99_ms"] / a.bench_ms_step
        fig["itl_p99_vs_step"] = r
        print(f"p99 inter-token / bench ms/step = {r:.2f}x (target <= 2x): "
              f"{'met' if r <= 2 else 'NOT met'}")
        ok &= r <= 2
    if a.json:
        with open(a.json, "w") as f:
            json.dump(fig, f, indent=1)
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
