#!/usr/bin/env python3
"""kernel_profile.py - where a decode step's GPU time goes, per kernel, for
any weight format: the per-kernel table issues 8 and 10 ask for.

Runs on the GPU machine (torch there: torch.profiler's CUPTI sees the
library's kernels too; nsys is not installed there):

  DSQWEN_LIBRARY=build/libdsqwen.so python3 tests/bench/kernel_profile.py \\
      --model /tmp/dsq_fullsize --quantize q4 --batch 1 --context 512

Prefills `batch` random prompts of `context` tokens, decodes warm-up steps
(CUDA graphs captured), then profiles `steps` decode steps without logits
and prints, per kernel name: us per step, launches per step, and the share
of the step's GPU time; then the wall time per step beside the GPU sum, so
launch gaps show. --json writes the table.

--prefill N profiles the prefill of one N-token prompt instead (a fresh
sequence each time, no logits: what a server's admission costs); with
--batch B > 1 it profiles the mixed step of issue 7 instead: B-1 sequences
of `context` tokens decoding one token each beside one N-token prompt chunk
(dsq_step, nothing sampled).  Prefill and mixed passes are not captured in
CUDA graphs, so wall minus GPU sum is the host's launch cost there.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

try:
    import torch
    from torch.profiler import ProfilerActivity, profile
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import dsqwen  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--quantize", default="none", help="none / int8 / q4 (at load)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--warm", type=int, default=8)
    ap.add_argument("--top", type=int, default=16)
    ap.add_argument("--json", default=None)
    ap.add_argument("--backend", default="cuda", help="cuda (cpu only to try the script)")
    ap.add_argument("--prefill", type=int, default=0, help="profile an N-token prefill (or mixed step)")
    ap.add_argument("--sample", action="store_true",
                    help="decode steps sample in the library (T 0.6 / top-p 0.95, dsq_step): lm_head and "
                         "sampling in the table, as dsqwen bench's default")
    a = ap.parse_args()
    if a.prefill:
        return prefill_main(a)
    with dsqwen.Model(a.model, backend=a.backend, quantize=a.quantize, load_tokenizer=False) as m:
        V = min(m.info.n_vocab, 151643)
        with m.context(max_seqs=a.batch, max_context=a.context + a.warm + 2 * a.steps + 8,
                       max_batch_tokens=max(a.context, 64)) as c:
            g = np.random.default_rng(11)
            for b in range(a.batch):
                c.prefill([int(x) for x in g.integers(0, V, a.context)], seq=b, logits=None)
            seqs = list(range(a.batch))
            sp = (m.sample_params(temperature=0.6, top_p=0.95, top_k=0, min_p=0.0, repetition_penalty=1.0,
                                  presence_penalty=0.0, frequency_penalty=0.0, seed=7) if a.sample else None)

            def dec():
                toks = [int(x) for x in g.integers(0, V, a.batch)]
                if sp is None:
                    c.decode_step(seqs, toks, logits=False)
                else:
                    c.step([(b, [toks[b]], sp) for b in seqs])

            for _ in range(a.warm):
                dec()
            c.synchronize()
            t = time.time()
            for _ in range(a.steps):
                dec()
            c.synchronize()
            wall_ms = (time.time() - t) / a.steps * 1e3
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as pr:
                for _ in range(a.steps):
                    dec()
                c.synchronize()
                torch.cuda.synchronize()
        info = m.info
    report(a, pr, wall_ms, info, f"{a.quantize} weights, batch {a.batch}, context {a.context}, {a.steps} steps, "
           + ("sampled T 0.6 / top-p 0.95" if a.sample else "no logits"), a.batch)


def prefill_main(a):
    """--prefill: one N-token prompt per call (fresh sequence), or with
    --batch > 1 the mixed step: batch-1 decoding rows beside the chunk."""
    n = a.prefill
    with dsqwen.Model(a.model, backend=a.backend, quantize=a.quantize, load_tokenizer=False) as m:
        V = min(m.info.n_vocab, 151643)
        g = np.random.default_rng(11)
        dec = a.batch - 1
        with m.context(max_seqs=a.batch, max_context=max(n, a.context + a.warm + 2 * a.steps + 8),
                       max_batch_tokens=n + dec) as c:
            for b in range(dec):
                c.prefill([int(x) for x in g.integers(0, V, a.context)], seq=b + 1, logits=None)
            c.synchronize()

            def one():
                if dec:
                    if c.seq_length(0):
                        c.truncate(0, 0)
                    batch = [(b + 1, [int(g.integers(0, V))]) for b in range(dec)]
                    c.step(batch + [(0, [int(x) for x in g.integers(0, V, n)])])
                    for b in range(dec):  # keep the decoding contexts at `context`
                        c.truncate(b + 1, a.context)
                else:
                    c.seq_remove(0)
                    c.prefill([int(x) for x in g.integers(0, V, n)], seq=0, logits=None)

            for _ in range(a.warm):
                one()
            c.synchronize()
            t = time.time()
            for _ in range(a.steps):
                one()
            c.synchronize()
            wall_ms = (time.time() - t) / a.steps * 1e3
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as pr:
                for _ in range(a.steps):
                    one()
                c.synchronize()
                torch.cuda.synchronize()
        info = m.info
    what = (f"mixed step: {dec} decoding rows at {a.context} + one {n}-token chunk" if dec
            else f"prefill of one {n}-token prompt")
    report(a, pr, wall_ms, info, f"{a.quantize} weights, {what}, {a.steps} calls, no logits", dec + n)


def report(a, pr, wall_ms, info, title, tokens):
    rows = []
    for e in pr.key_averages():
        us = getattr(e, "device_time_total", None)
        if us is None:
            us = getattr(e, "cuda_time_total", 0)
        if us and us > 0 and e.count > 0:
            rows.append(dict(kernel=e.key, us_per_step=us / a.steps, launches_per_step=e.count / a.steps))
    rows.sort(key=lambda r: -r["us_per_step"])
    gpu_us = sum(r["us_per_step"] for r in rows)
    print(f"[{title}; weight_bytes {info.weight_bytes / 1e6:.0f} MB, device_bytes {info.device_bytes / 1e6:.0f} MB]")
    print(f"wall {wall_ms:.3f} ms/step ({tokens / wall_ms * 1e3:.0f} tok/s); GPU kernels sum "
          f"{gpu_us / 1e3:.3f} ms/step; weight floor {info.weight_bytes / 4.48e12 * 1e3:.3f} ms")
    print(f"{'us/step':>9} {'launch':>7} {'share':>6}  kernel")
    for r in rows[:a.top]:
        print(f"{r['us_per_step']:9.1f} {r['launches_per_step']:7.1f} {100 * r['us_per_step'] / gpu_us:5.1f}%  "
              f"{r['kernel'][:110]}")
    excl, api = exclusive_times(pr, a.steps)
    if api:
        print("host time in CUDA calls, us/step (count/step): " + ", ".join(
            f"{k} {v[0]:.1f} ({v[1]:.1f})" for k, v in sorted(api.items(), key=lambda kv: -kv[1][0])[:8]))
    if excl:
        busy = sum(excl.values())
        print(f"timeline (PDL overlap resolved: each kernel charged only the time it extends the GPU's busy span; "
              f"idle = no kernel or copy running): busy+idle {busy / 1e3:.3f} ms/step")
        print(f"{'us/step':>9} {'share':>6}  kernel (exclusive)")
        for k, v in sorted(excl.items(), key=lambda kv: -kv[1])[:a.top + 4]:
            print(f"{v:9.1f} {100 * v / busy:5.1f}%  {k[:110]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(args=vars(a), wall_ms=wall_ms, gpu_ms=gpu_us / 1e3, rows=rows, exclusive_us=excl,
                           api_us=api),
                      f, indent=1)


def exclusive_times(pr, steps):
    """Per name, the time each kernel / copy adds to the GPU's busy span (a
    kernel launched early under PDL overlaps the one before it: only its
    part past the previous end counts), plus the idle gaps between them
    (charged to '(idle before <name>)'), per step.  From the profiler's
    chrome trace; empty if it cannot be read.  Second result: per CUDA
    runtime / driver call name, (host us per step, calls per step)."""
    import tempfile
    try:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            path = f.name
        pr.export_chrome_trace(path)
        with open(path) as f:
            tr = json.load(f)
        os.unlink(path)
    except Exception as e:  # noqa: BLE001 - a missing timeline only drops this table
        print(f"(no timeline: {e})")
        return {}, {}
    api = {}
    for e in tr.get("traceEvents", []):
        if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver"):
            v = api.setdefault(e.get("name", "?"), [0.0, 0])
            v[0] += float(e.get("dur", 0))
            v[1] += 1
    api = {k: (v[0] / steps, v[1] / steps) for k, v in api.items()}
    # the GPU's wait for a replayed graph: cudaGraphLaunch's start (host) to
    # the first kernel that starts after it (same clock in the trace)
    gl = sorted(float(e["ts"]) for e in tr.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"
                and e.get("name", "").startswith("cudaGraphLaunch"))
    ks = sorted(float(e["ts"]) for e in tr.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"
                and e.get("cat") == "kernel")
    lat = []
    for t0 in gl:
        nxt = [k for k in ks if k >= t0][:1]
        if nxt:
            lat.append(nxt[0] - t0)
    if lat:
        lat.sort()
        api["(graph launch call -> its first kernel, median)"] = (lat[len(lat) // 2], 1.0)
    evs = [e for e in tr.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"
           and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    evs.sort(key=lambda e: e["ts"])
    out, end = {}, None
    for e in evs:
        ts, te = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))
        name = e.get("name", "?")
        if end is not None and ts > end:
            gap = "(idle before " + name[:60] + ")"
            out[gap] = out.get(gap, 0.0) + (ts - end)
        add = te - max(ts, end) if end is not None else te - ts
        if add > 0:
            out[name] = out.get(name, 0.0) + add
        end = te if end is None else max(end, te)
    return {k: v / steps for k, v in out.items()}, api


if __name__ == "__main__":
    main()
