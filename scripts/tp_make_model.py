#!/usr/bin/env python3
"""tp_make_model.py - a random-weight Qwen2 checkpoint of a real model's
shape, for tensor-parallel benchmarks (scripts/tp_check.sh).  Standard
library only; fast enough for the 72B shape (145 GB of bf16): one block of
random bf16 values (magnitude 2^-7..2^-4, random sign) is written over and
over, norms are 1.0.  Bandwidth benchmarks read every byte whatever the
values; numerics are checked elsewhere (tests/fixtures/shape_check.py).

    python3 scripts/tp_make_model.py --shape 32b --out DIR [--layers N]

Shapes: 1.5b, 7b, 14b, 32b (DeepSeek-R1-Distill-Qwen), 72b (Qwen2.5-72B:
hidden 8192, 80 layers, 64 / 8 heads, intermediate 29568, vocab 152064).
"""
import argparse
import json
import os
import struct

SHAPES = {  # hidden, layers, heads, kv heads, intermediate, vocab, tied
    "1.5b": (1536, 28, 12, 2, 8960, 151936, False),
    "7b": (3584, 28, 28, 4, 18944, 152064, False),
    "14b": (5120, 48, 40, 8, 13824, 152064, False),
    "32b": (5120, 64, 40, 8, 27648, 152064, False),
    "72b": (8192, 80, 64, 8, 29568, 152064, False),
}
BLOCK = 1 << 24  # bytes of random bf16 reused for every tensor


def random_block():
    buf = bytearray(os.urandom(BLOCK))
    # little-endian bf16: odd bytes hold the sign and the exponent's top 7
    # bits; exponent 120..123 (2^-7..2^-4), sign kept from the random bit
    table = bytes(((b & 0x80) | (60 + (b & 1))) for b in range(256))
    buf[1::2] = bytes(buf[1::2]).translate(table)
    return bytes(buf)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=0, help="0: the shape's depth")
    a = ap.parse_args()
    E, L, H, KV, F, V, tied = SHAPES[a.shape]
    if a.layers:
        L = a.layers
    D = E // H
    os.makedirs(a.out, exist_ok=True)
    cfg = {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
        "hidden_size": E, "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": KV,
        "intermediate_size": F, "vocab_size": V, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": tied,
        "use_sliding_window": False, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    tensors = [("model.embed_tokens.weight", [V, E])]
    for l in range(L):
        p = f"model.layers.{l}."
        tensors += [
            (p + "input_layernorm.weight", [E]),
            (p + "self_attn.q_proj.weight", [H * D, E]), (p + "self_attn.q_proj.bias", [H * D]),
            (p + "self_attn.k_proj.weight", [KV * D, E]), (p + "self_attn.k_proj.bias", [KV * D]),
            (p + "self_attn.v_proj.weight", [KV * D, E]), (p + "self_attn.v_proj.bias", [KV * D]),
            (p + "self_attn.o_proj.weight", [E, H * D]),
            (p + "post_attention_layernorm.weight", [E]),
            (p + "mlp.gate_proj.weight", [F, E]), (p + "mlp.up_proj.weight", [F, E]),
            (p + "mlp.down_proj.weight", [E, F]),
        ]
    tensors.append(("model.norm.weight", [E]))
    if not tied:
        tensors.append(("lm_head.weight", [V, E]))
    header, off = {}, 0
    for name, shape in tensors:
        n = 2
        for s in shape:
            n *= s
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    block = random_block()
    one = struct.pack("<H", 0x3F80)  # bf16 1.0
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name, shape in tensors:
            n = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            if name.endswith("norm.weight"):
                f.write(one * (n // 2))
                continue
            while n > 0:
                k = min(n, BLOCK)
                f.write(block[:k])
                n -= k
    print(f"{a.out}: {a.shape} shape, {L} layers, {off / 1e9:.1f} GB")


if __name__ == "__main__":
    main()
