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
    a = ap.parse_args()
    with dsqwen.Model(a.model, backend=a.backend, quantize=a.quantize, load_tokenizer=False) as m:
        V = min(m.info.n_vocab, 151643)
        with m.context(max_seqs=a.batch, max_context=a.context + a.warm + 2 * a.steps + 8,
                       max_batch_tokens=max(a.context, 64)) as c:
            g = np.random.default_rng(11)
            for b in range(a.batch):
                c.prefill([int(x) for x in g.integers(0, V, a.context)], seq=b, logits=None)
            seqs = list(range(a.batch))
            for _ in range(a.warm):
                c.decode_step(seqs, [int(x) for x in g.integers(0, V, a.batch)], logits=False)
            c.synchronize()
            t = time.time()
            for _ in range(a.steps):
                c.decode_step(seqs, [int(x) for x in g.integers(0, V, a.batch)], logits=False)
            c.synchronize()
            wall_ms = (time.time() - t) / a.steps * 1e3
            with profile(activities=[ProfilerActivity.CUDA]) as pr:
                for _ in range(a.steps):
                    c.decode_step(seqs, [int(x) for x in g.integers(0, V, a.batch)], logits=False)
                c.synchronize()
                torch.cuda.synchronize()
        info = m.info
    rows = []
    for e in pr.key_averages():
        us = getattr(e, "device_time_total", None)
        if us is None:
            us = getattr(e, "cuda_time_total", 0)
        if us and us > 0 and e.count > 0:
            rows.append(dict(kernel=e.key, us_per_step=us / a.steps, launches_per_step=e.count / a.steps))
    rows.sort(key=lambda r: -r["us_per_step"])
    gpu_us = sum(r["us_per_step"] for r in rows)
    print(f"[{a.quantize} weights, batch {a.batch}, context {a.context}, {a.steps} steps, no logits; "
          f"weight_bytes {info.weight_bytes / 1e6:.0f} MB, device_bytes {info.device_bytes / 1e6:.0f} MB]")
    print(f"wall {wall_ms:.3f} ms/step ({a.batch / wall_ms * 1e3:.0f} tok/s); GPU kernels sum "
          f"{gpu_us / 1e3:.3f} ms/step; weight floor {info.weight_bytes / 4.48e12 * 1e3:.3f} ms")
    print(f"{'us/step':>9} {'launch':>7} {'share':>6}  kernel")
    for r in rows[:a.top]:
        print(f"{r['us_per_step']:9.1f} {r['launches_per_step']:7.1f} {100 * r['us_per_step'] / gpu_us:5.1f}%  "
              f"{r['kernel'][:110]}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(args=vars(a), wall_ms=wall_ms, gpu_ms=gpu_us / 1e3, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
