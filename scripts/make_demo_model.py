#!/usr/bin/env python3
"""Write a small random-weight Qwen2 model with the REAL vocabulary and
tokenizer, so the CLI can show text generation anywhere (gibberish text, since
the weights are random).  Standard library only (any python3 >= 3.9), so it
runs with whatever `python3` is first on PATH.

    python3 scripts/make_demo_model.py OUTDIR

OUTDIR gets config.json, model.safetensors (bf16, ~160 MB),
tokenizer.json, tokenizer_config.json, generation_config.json.
The same OUTDIR contents come out on every run (fixed seed).
"""
import json
import os
import random
import shutil
import statistics
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_FILES = os.path.join(HERE, "..", "tests", "data", "model")
SEED = 7


def bf16_bits(x):
    """fp32 value -> bf16 bit pattern (round to nearest even)."""
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def level_tables(values):
    """256 bf16 values -> (low-byte, high-byte) bytes.translate tables."""
    bits = [bf16_bits(v) for v in values]
    return bytes(b & 0xFF for b in bits), bytes(b >> 8 for b in bits)


# Each weight is one random byte mapped to one of 256 levels: the 256
# quantile midpoints of N(0, 1) (scaled per tensor) or evenly spaced values
# of U(lo, hi).  Mapping bytes through translate tables keeps the ~80 M
# values at C speed without numpy; 256 levels are plenty for a demo.
NORMAL_LEVELS = [statistics.NormalDist().inv_cdf((i + 0.5) / 256) for i in range(256)]


class Weights:
    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.tables = {}

    def _draw(self, n, key, levels):
        if key not in self.tables:
            self.tables[key] = level_tables(levels)
        lo, hi = self.tables[key]
        u = self.rng.randbytes(n)
        out = bytearray(2 * n)  # little-endian bf16: low byte first
        out[0::2] = u.translate(lo)
        out[1::2] = u.translate(hi)
        return bytes(out)

    def normal(self, std, shape):
        n = shape[0] * (shape[1] if len(shape) > 1 else 1)
        return shape, self._draw(n, ("n", std), [std * v for v in NORMAL_LEVELS])

    def uniform(self, lo, hi, shape):
        n = shape[0] * (shape[1] if len(shape) > 1 else 1)
        return shape, self._draw(n, ("u", lo, hi),
                                 [lo + (hi - lo) * (i + 0.5) / 256 for i in range(256)])


def main(out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(MODEL_FILES, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(hidden_size=256, num_attention_heads=2, num_key_value_heads=1,
               intermediate_size=512, num_hidden_layers=2, max_window_layers=2,
               tie_word_embeddings=False, max_position_embeddings=8192)
    E, H, K, D, F, V = 256, 2, 1, 128, 512, cfg["vocab_size"]
    w = Weights(SEED)
    t = {}
    t["model.embed_tokens.weight"] = w.normal(0.5, (V, E))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = w.uniform(0.5, 1.5, (E,))
        t[p + "post_attention_layernorm.weight"] = w.uniform(0.5, 1.5, (E,))
        for n, rows in (("q", H * D), ("k", K * D), ("v", K * D)):
            t[p + f"self_attn.{n}_proj.weight"] = w.normal(0.06, (rows, E))
            t[p + f"self_attn.{n}_proj.bias"] = w.normal(0.2, (rows,))
        t[p + "self_attn.o_proj.weight"] = w.normal(0.06, (E, H * D))
        t[p + "mlp.gate_proj.weight"] = w.normal(0.06, (F, E))
        t[p + "mlp.up_proj.weight"] = w.normal(0.06, (F, E))
        t[p + "mlp.down_proj.weight"] = w.normal(0.04, (E, F))
    t["model.norm.weight"] = w.uniform(0.5, 1.5, (E,))
    # untied: with a tied head a random model mostly repeats its last token
    t["lm_head.weight"] = w.normal(0.5, (V, E))

    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, (shape, b) in t.items():
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    tmp = os.path.join(out, "model.safetensors.tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, b in t.values():
            f.write(b)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for n in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(MODEL_FILES, n), os.path.join(out, n))
    # last, so an interrupted run never leaves a model.safetensors that
    # run.sh would take as finished
    os.replace(tmp, os.path.join(out, "model.safetensors"))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/demo-model")
