#!/usr/bin/env python3
"""Write a small random-weight Qwen2 model with the REAL vocabulary and
tokenizer, so the CLI can show text generation anywhere (gibberish text, since
the weights are random).  Needs numpy only.

    python3 scripts/make_demo_model.py OUTDIR

OUTDIR gets config.json, model.safetensors (bf16, ~160 MB),
tokenizer.json, tokenizer_config.json, generation_config.json.
"""
import json
import os
import shutil
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_FILES = os.path.join(HERE, "..", "tests", "data", "model")


def bf16(a):
    """fp32 -> bf16 bit patterns (round to nearest even)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    r = ((u >> 16) & 1) + 0x7FFF
    return ((u + r) >> 16).astype(np.uint16)


def main(out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(MODEL_FILES, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(hidden_size=256, num_attention_heads=2, num_key_value_heads=1,
               intermediate_size=512, num_hidden_layers=2, max_window_layers=2,
               tie_word_embeddings=False, max_position_embeddings=8192)
    E, H, K, D, F, V = 256, 2, 1, 128, 512, cfg["vocab_size"]
    rng = np.random.default_rng(7)
    t = {}
    t["model.embed_tokens.weight"] = rng.normal(0, 0.5, (V, E))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = rng.uniform(0.5, 1.5, E)
        t[p + "post_attention_layernorm.weight"] = rng.uniform(0.5, 1.5, E)
        for n, rows in (("q", H * D), ("k", K * D), ("v", K * D)):
            t[p + f"self_attn.{n}_proj.weight"] = rng.normal(0, 0.06, (rows, E))
            t[p + f"self_attn.{n}_proj.bias"] = rng.normal(0, 0.2, rows)
        t[p + "self_attn.o_proj.weight"] = rng.normal(0, 0.06, (E, H * D))
        t[p + "mlp.gate_proj.weight"] = rng.normal(0, 0.06, (F, E))
        t[p + "mlp.up_proj.weight"] = rng.normal(0, 0.06, (F, E))
        t[p + "mlp.down_proj.weight"] = rng.normal(0, 0.04, (E, F))
    t["model.norm.weight"] = rng.uniform(0.5, 1.5, E)
    # untied: with a tied head a random model mostly repeats its last token
    t["lm_head.weight"] = rng.normal(0, 0.5, (V, E))

    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in t.items():
        b = bf16(a).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(np.shape(a)), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for n in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(MODEL_FILES, n), os.path.join(out, n))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/demo-model")
