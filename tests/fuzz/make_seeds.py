#!/usr/bin/env python3
"""Write the seed corpora of tests/fuzz/corpus/ (run from anywhere).

Seeds are valid minimal inputs plus the malformed cases worth keeping in
every replay: truncation, huge lengths, overlapping ranges, bad UTF-8, deep
nesting, odd merges.  The small tokenizer is cut from the real
tests/data/model/tokenizer.json (its byte alphabet, a few merges, the added
tokens, the same pre-tokenizer/post-processor/decoder).  Seeds that the
library crashes on must NOT go here (the replay ctest would fail): put them
under tests/fuzz/crashes/ and report them.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")
REAL_TOK = os.path.join(HERE, "..", "data", "model", "tokenizer.json")
REAL_CFG = os.path.join(HERE, "..", "data", "model", "config.json")


def put(kind, name, data):
    d = os.path.join(CORPUS, kind)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- safetensors ------------------------------------------------------------

def st(header, data=b"", hlen=None, pad=True):
    h = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h) if hlen is None else hlen) + h + data


def safetensors():
    one = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    valid = st(one, struct.pack("<2f", 1.0, -2.0))
    put("safetensors", "valid_one_f32", valid)
    put("safetensors", "valid_empty_header", st({}))
    put("safetensors", "valid_mixed_dtypes_meta", st({
        "__metadata__": {"format": "pt"},
        "a.bf16": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
        "b.f16": {"dtype": "F16", "shape": [1], "data_offsets": [12, 14]},
        "c.i64": {"dtype": "I64", "shape": [1], "data_offsets": [14, 22]},
        "d.scalar": {"dtype": "F32", "shape": [], "data_offsets": [22, 26]},
        "e.zero": {"dtype": "F32", "shape": [0, 5], "data_offsets": [26, 26]},
    }, bytes(range(26))))
    # header length not a multiple of 8: data misaligned, the reader copies
    put("safetensors", "valid_misaligned", st(one, struct.pack("<2f", 3.0, 4.0), pad=False)
        if len(json.dumps(one, separators=(",", ":"))) % 4 else
        st(json.dumps(one, separators=(",", ":")).encode() + b" ", struct.pack("<2f", 3.0, 4.0), pad=False))
    put("safetensors", "short_7_bytes", b"\x08\x00\x00\x00\x00\x00\x00")
    put("safetensors", "truncated_header", valid[:20])
    put("safetensors", "truncated_data", valid[:-3])
    put("safetensors", "hlen_huge", st(one, b"\0" * 8, hlen=0xFFFFFFFFFFFFFFFF))
    put("safetensors", "hlen_past_end", st(one, b"\0" * 8, hlen=1 << 20))
    put("safetensors", "hlen_zero", st(one, b"\0" * 8, hlen=0))
    put("safetensors", "overlap", st({
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12))
    put("safetensors", "hole", st({
        "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
        "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, b"\0" * 12))
    put("safetensors", "offsets_past_end", st({
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8))
    put("safetensors", "offsets_reversed", st({
        "a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}}, b"\0" * 8))
    put("safetensors", "offsets_u64_wrap", st(
        b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,0]}}', b"\0" * 4))
    put("safetensors", "shape_nbytes_mismatch", st({
        "a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8))
    put("safetensors", "shape_overflow", st(
        b'{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}}', b"\0" * 8))
    put("safetensors", "shape_negative", st({
        "a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8))
    put("safetensors", "shape_float", st(
        b'{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}', b"\0" * 8))
    put("safetensors", "shape_9_dims", st({
        "a": {"dtype": "F32", "shape": [1] * 9, "data_offsets": [0, 4]}}, b"\0" * 4))
    put("safetensors", "dtype_unknown", st({
        "a": {"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8))
    put("safetensors", "duplicate_name", st(
        b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
        b'"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', b"\0" * 8))
    put("safetensors", "duplicate_field", st(
        b'{"a":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4))
    put("safetensors", "bad_utf8_name", st(
        b'{"\xff\xc0a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4))
    put("safetensors", "nul_in_name", st(
        b'{"a\\u0000b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4))
    put("safetensors", "trailing_after_json", st(
        b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}xx', b"\0" * 4))
    put("safetensors", "not_object", st(b"[1,2,3]"))
    put("safetensors", "deep_nesting_meta", st(
        b'{"__metadata__":' + b'{"a":' * 3000 + b'1' + b'}' * 3000 + b'}'))
    put("safetensors", "meta_non_string", st({"__metadata__": {"format": 1}}))
    put("safetensors", "entry_not_object", st({"a": [1, 2]}))


# ---- config.json ------------------------------------------------------------

def config():
    real = open(REAL_CFG, "rb").read()
    put("config", "valid_real", real)
    cfg = json.loads(real)
    minimal = {k: cfg[k] for k in ("model_type", "vocab_size", "hidden_size", "num_hidden_layers",
                                   "num_attention_heads", "num_key_value_heads",
                                   "intermediate_size", "max_position_embeddings",
                                   "rms_norm_eps")}
    put("config", "valid_minimal", json.dumps(minimal))
    put("config", "valid_head_dim_eos_list", json.dumps(dict(minimal, head_dim=64,
                                                             eos_token_id=[5, 6], bos_token_id=None)))
    put("config", "valid_tiny", json.dumps(dict(minimal, vocab_size=16, hidden_size=8,
                                                num_hidden_layers=1, num_attention_heads=2,
                                                num_key_value_heads=1, intermediate_size=4,
                                                max_position_embeddings=4)))
    put("config", "heads_not_multiple", json.dumps(dict(minimal, num_key_value_heads=5)))
    put("config", "head_dim_odd", json.dumps(dict(minimal, head_dim=63)))
    put("config", "size_huge", json.dumps(dict(minimal, hidden_size=1e300)))
    put("config", "size_float", json.dumps(dict(minimal, hidden_size=1536.5)))
    put("config", "size_negative", json.dumps(dict(minimal, vocab_size=-1)))
    put("config", "size_string", json.dumps(dict(minimal, vocab_size="151936")))
    put("config", "eps_zero", json.dumps(dict(minimal, rms_norm_eps=0)))
    put("config", "eps_overflow_literal", json.dumps(minimal).replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": 1e400'))
    put("config", "theta_tiny", json.dumps(dict(minimal, rope_theta=1e-46)))
    put("config", "eos_out_of_vocab", json.dumps(dict(minimal, eos_token_id=10 ** 9)))
    put("config", "sliding_window_on", json.dumps(dict(minimal, use_sliding_window=True)))
    put("config", "rope_scaling", json.dumps(dict(minimal, rope_scaling={"type": "yarn", "factor": 4})))
    put("config", "other_arch", json.dumps(dict(minimal, model_type="llama",
                                                architectures=["LlamaForCausalLM"])))
    put("config", "arch_not_list", json.dumps(dict(minimal, architectures=7)))
    put("config", "missing_field", json.dumps({k: v for k, v in minimal.items() if k != "vocab_size"}))
    put("config", "trailing_garbage", json.dumps(minimal) + " }")
    put("config", "truncated", real[: len(real) // 2])
    put("config", "not_object", "[1, 2, 3]")
    put("config", "empty", b"")
    put("config", "deep_nesting", b"[" * 5000 + b"]" * 5000)
    put("config", "deep_nesting_value", b'{"model_type":"qwen2","x":' + b"[" * 4000 + b"]" * 4000 + b"}")
    put("config", "bad_utf8", b'{"model_type":"qw\xffen2\xc3"}')
    put("config", "embedded_nul", json.dumps(minimal).encode() + b"\0 garbage")
    put("config", "dup_keys", b'{"vocab_size":1,"vocab_size":151936}')


# ---- tokenizer.json -----------------------------------------------------------

def tokenizer():
    real = json.load(open(REAL_TOK, encoding="utf-8"))
    vocab = real["model"]["vocab"]
    bos = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"

    def dump(obj):
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))

    def cut(keep_byte, n_merges):
        """Byte chars with keep_byte(id), merges among them, dense ids, some added tokens."""
        small = {t: i for t, i in vocab.items() if i < 256 and keep_byte(i)}
        merges = []
        for a, b in real["model"]["merges"][:2000]:
            if len(merges) == n_merges:
                break
            if a in small and b in small and a + b in vocab:
                small[a + b] = vocab[a + b]
                merges.append([a, b])
        remap = {old: new for new, old in enumerate(sorted(small.values()))}
        dense = {t: remap[i] for t, i in small.items()}
        n = len(dense)
        keep = [a for a in real["added_tokens"] if a["id"] <= 151646 or a["content"] == "<think>"]
        added = [dict(a, id=n + k) for k, a in enumerate(keep)]
        post = json.loads(json.dumps(real["post_processor"]))
        post["special_tokens"] = {bos: dict(post["special_tokens"][bos],
                                            ids=[[a["id"] for a in added if a["content"] == bos][0]])}
        del post["pair"]
        tok = dict(real, added_tokens=added, post_processor=post)
        tok["model"] = dict(real["model"], vocab=dense, merges=merges)
        return tok, dense, merges, added, post, n

    # the full byte alphabet: every input is encodable
    put("tokenizer", "valid_small", dump(cut(lambda i: True, 120)[0]))
    # variants on a smaller cut: printable ASCII plus the space/newline chars
    tok, dense, merges, added, post, n = cut(lambda i: i < 94 or i in (198, 220), 30)
    put("tokenizer", "valid_ascii_cut", dump(tok))

    strmerges = dict(tok, model=dict(tok["model"], merges=[a + " " + b for a, b in merges]))
    put("tokenizer", "valid_string_merges", dump(strmerges))
    put("tokenizer", "valid_no_added_no_post",
        dump(dict(tok, added_tokens=[], post_processor=None, normalizer=None)))

    def with_model(**kw):
        return dump(dict(tok, model=dict(tok["model"], **kw)))

    put("tokenizer", "merge_unknown_token", with_model(merges=merges + [["zz", "qq"]]))
    put("tokenizer", "merge_result_missing", with_model(merges=merges + [["Ġ", "\u00ff"]]))
    put("tokenizer", "merge_three_parts", with_model(merges=[a + " " + b + " c" for a, b in merges[:5]]))
    put("tokenizer", "merge_one_part", with_model(merges=["Ġ"]))
    put("tokenizer", "merge_duplicate", with_model(merges=merges + merges[:3]))
    put("tokenizer", "merge_not_list", with_model(merges={"a": "b"}))
    put("tokenizer", "merge_self_cycle", with_model(merges=[["a", "a"], ["aa", "aa"], ["aaaa", "aaaa"]],
                                                    vocab=dict(dense, aa=n + 100, aaaa=n + 101,
                                                               aaaaaaaa=n + 102)))
    put("tokenizer", "vocab_id_huge", with_model(vocab=dict(dense, huge=2147483647)))
    put("tokenizer", "vocab_id_negative", with_model(vocab=dict(dense, neg=-1)))
    put("tokenizer", "vocab_id_float", with_model(vocab=dict(dense, flt=1.5)))
    put("tokenizer", "vocab_duplicate_id", with_model(vocab=dict(dense, dup=0)))
    put("tokenizer", "vocab_missing_bytes", with_model(vocab={t: i for t, i in dense.items() if i > 10},
                                                       merges=[]))
    put("tokenizer", "vocab_empty_string", with_model(vocab=dict(dense, **{"": n + 50})))
    put("tokenizer", "unk_token_missing", with_model(unk_token="<unk>"))
    put("tokenizer", "model_wordpiece", with_model(type="WordPiece"))
    put("tokenizer", "added_overlapping_id", dump(dict(tok, added_tokens=added + [
        dict(added[0], id=5, content="hello")])))
    put("tokenizer", "added_empty_content", dump(dict(tok, added_tokens=added + [
        dict(added[0], id=n + 90, content="")])))
    put("tokenizer", "added_normalized_lstrip", dump(dict(tok, added_tokens=added + [
        dict(added[0], id=n + 91, content="caf\u0065\u0301", normalized=True, lstrip=True,
             rstrip=True, single_word=True)])))
    put("tokenizer", "regex_invalid", dump(dict(tok, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(?i:'s|[unclosed"}, "behavior": "Isolated", "invert": False},
        tok["pre_tokenizer"]["pretokenizers"][1]]})))
    put("tokenizer", "regex_catastrophic", dump(dict(tok, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": False},
        tok["pre_tokenizer"]["pretokenizers"][1]]})))
    put("tokenizer", "normalizer_nfkc", dump(dict(tok, normalizer={"type": "NFKC"})))
    put("tokenizer", "template_unknown_token", dump(dict(tok, post_processor=dict(
        post, single=[{"SpecialToken": {"id": "<nope>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]))))
    s = dump(tok).encode("utf-8")
    put("tokenizer", "truncated", s[: len(s) // 3])
    put("tokenizer", "bad_utf8_vocab", s.replace(b'"\xc4\xa0":', b'"\xff\xfe":', 1))
    put("tokenizer", "deep_nesting", b'{"model":' + b"[" * 5000 + b"]" * 5000 + b"}")
    put("tokenizer", "not_object", b"null")


# ---- tokenize (first byte: flags) ---------------------------------------------

def tokenize():
    texts = {
        "ascii": "Hello, world! It's 2024; don't panic.\n",
        "mixed_lang": "English, \u4e2d\u6587\u6df7\u5408, \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8, "
                      "\ud55c\uad6d\uc5b4, \u0420\u0443\u0441\u0441\u043a\u0438\u0439, "
                      "\u0627\u0644\u0639\u0631\u0628\u064a\u0629, \u05e2\u05d1\u05e8\u05d9\u05ea, "
                      "\u0939\u093f\u0928\u094d\u0926\u0940, \u0e44\u0e17\u0e22",
        "emoji_zwj": "\U0001F468\u200d\U0001F469\u200d\U0001F467 \U0001F1EB\U0001F1F7 \u2764\ufe0f",
        "nfc_combining": "cafe\u0301 A\u030a \u1e9b\u0323 \uac00\u11a8",
        "specials": "<\uff5cUser\uff5c>2+2?<\uff5cAssistant\uff5c><think>\nok\n</think>4"
                    "<\uff5cend\u2581of\u2581sentence\uff5c>",
        "code": "def f(x):\n\treturn x**2  # sq\n\n\n    \r\n  ",
        "numbers": "3.14159 1,000,000 0x1F \u0661\u0662\u0663 \u2167",
        "whitespace_runs": " " * 40 + "\t\t\n\n\n" + "\u3000\u00a0x",
    }
    for i, (name, t) in enumerate(texts.items()):
        put("tokenize", name, bytes([i & 3]) + t.encode("utf-8"))
    bad = {
        "bad_lone_continuation": b"a\x80b\xbfc",
        "bad_truncated_seqs": b"\xe2\x82 \xf0\x9f\x98 \xc3",
        "bad_overlong": b"\xc0\xaf\xe0\x80\xaf\xf0\x80\x80\xaf",
        "bad_surrogates": b"\xed\xa0\x80\xed\xbf\xbf",
        "bad_above_max": b"\xf4\x90\x80\x80\xf8\x88\x80\x80\x80\xff\xfe",
        "bad_in_special": b"<\xef\xbd\x9cUser\xef\xbd\x9c\xff>",
        "nul_bytes": b"a\x00b\x00\x00c",
        "empty": b"",
    }
    for i, (name, t) in enumerate(bad.items()):
        put("tokenize", name, bytes([i & 3]) + t)
    put("tokenize", "flags_only", b"\x03")


# ---- tokenize_regex: options byte, regex, 0x00, text ------------------------------

QWEN_RE = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
           "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def tokenize_regex():
    text = "Hello w\u00f6rld, it's 2024!  aaab ab\n\n\tcafe\u0301 \u65e5\u672c <|s|>word words \U0001F600 "
    regexes = {
        "qwen": QWEN_RE,
        # empty matches at the end of the text (issue 14: read past the text)
        "end_dollar": "$",
        "end_z": "\\z",
        "end_Z": "\\Z",
        "word_or_end": "\\w+|$",
        "star_group_end": "(a+)*$",
        "empty": "",
        "empty_group": "(?:)",
        "word_boundary": "\\b",
        "lookahead_or_end": "(?=a)|$",
        "space_star_end": "\\s*$",
        "qwen_or_end": QWEN_RE + "|$",
        # catastrophic backtracking: PCRE2's match limit (DSQ_ERR_FORMAT)
        "catastrophic": "(a+)+$",
        "catastrophic_alt": "(a|aa)+$",
        "nested_quant": "((a*)*)*b",
        "backref": "(\\w)\\1+",
        "lookbehind": "(?<=a)b|(?<!x)\\d",
        "case_insensitive": "(?i:ab|\u00e9)",
        "unicode_props": "\\p{Lu}\\p{Ll}*|\\p{N}+|\\P{L}",
        "class_ws": "[\\s\\S]",
        "verb_limit": "(*LIMIT_MATCH=10)(a+)+$",
        "unsupported_escape": "\\K",
        "unbalanced": "(a",
        "bad_utf8": b"\xff\xfe+",
        "literal_nul": "a\\x00b",
    }
    for i, (name, rx) in enumerate(regexes.items()):
        rx = rx if isinstance(rx, bytes) else rx.encode("utf-8")
        for opts, tag in ((i % 4, ""), (0x08 | (i % 4), "_added"), (0x04, "_nfc"), (0x1c, "_nfc_strip")):
            if tag and name not in ("qwen", "end_dollar", "word_or_end", "catastrophic", "qwen_or_end"):
                continue
            put("tokenize_regex", name + tag, bytes([opts]) + rx + b"\0" + text.encode("utf-8"))
    # texts that end the way empty matches do: after a newline, inside
    # a multi-byte character run, invalid UTF-8 at the end
    for j, t in enumerate([b"", b"a", b"aaa\n", b"x\n\n", b"\xe6\x97\xa5", b"ab\xf0\x9f\x98\x80",
                           b"abc\xe2\x82", b"a" * 40 + b"b", b" " * 64]):
        put("tokenize_regex", "end_text_%d" % j, bytes([j % 4]) + b"$\0" + t)
    put("tokenize_regex", "no_separator", b"\x00\\w+|$")


# ---- index: u16 len + index JSON, u16 len + a.safetensors, rest b.safetensors -----

def index():
    def lp(b):
        return struct.pack("<H", len(b)) + b

    def idx(wmap, meta=True):
        o = {"weight_map": wmap}
        if meta:
            o["metadata"] = {"total_size": 16}
        return json.dumps(o).encode()

    a = st({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, struct.pack("<2f", 1, 2))
    b = st({"y": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}}, b"\1" * 8)
    both = {"x": "a.safetensors", "y": "b.safetensors"}
    put("index", "valid_two_shards", lp(idx(both)) + lp(a) + b)
    put("index", "valid_one_shard", lp(idx({"x": "a.safetensors"}, meta=False)) + lp(a) + b"")
    put("index", "tensor_in_wrong_shard", lp(idx({"x": "b.safetensors", "y": "a.safetensors"})) + lp(a) + b)
    put("index", "tensor_missing_from_shard", lp(idx(dict(both, z="a.safetensors"))) + lp(a) + b)
    put("index", "shard_missing", lp(idx({"x": "c.safetensors"})) + lp(a) + b)
    put("index", "shard_path_traversal", lp(idx({"x": "../a.safetensors"})) + lp(a) + b)
    put("index", "shard_absolute", lp(idx({"x": "/etc/passwd"})) + lp(a) + b)
    put("index", "shard_dot_slash", lp(idx({"x": "./a.safetensors", "y": "a.safetensors"})) + lp(a) + b)
    put("index", "shard_is_index", lp(idx({"x": "model.safetensors.index.json"})) + lp(a) + b)
    put("index", "shard_empty_name", lp(idx({"x": ""})) + lp(a) + b)
    put("index", "shard_not_string", lp(b'{"weight_map":{"x":1}}') + lp(a) + b)
    put("index", "weight_map_empty", lp(b'{"weight_map":{}}') + lp(a) + b)
    put("index", "weight_map_missing", lp(b'{"metadata":{}}') + lp(a) + b)
    put("index", "weight_map_array", lp(b'{"weight_map":["a.safetensors"]}') + lp(a) + b)
    put("index", "duplicate_tensor", lp(b'{"weight_map":{"x":"a.safetensors","x":"b.safetensors"}}') + lp(a) + b)
    put("index", "nul_in_tensor_name", lp(b'{"weight_map":{"x\\u0000evil":"a.safetensors"}}') + lp(a) + b)
    put("index", "nul_in_shard_name", lp(b'{"weight_map":{"x":"a.safetensors\\u0000x"}}') + lp(a) + b)
    put("index", "trailing_garbage", lp(idx(both) + b" x") + lp(a) + b)
    put("index", "not_json", lp(b"{weight_map") + lp(a) + b)
    put("index", "deep_nesting", lp(b'{"metadata":' + b"[" * 3000 + b"]" * 3000 + b"}") + lp(a) + b)
    put("index", "shard_truncated", lp(idx(both)) + lp(a[:-3]) + b[:12])
    put("index", "shard_hlen_huge", lp(idx(both)) + lp(b"\xff" * 8 + a[8:]) + b)
    put("index", "many_shard_names", lp(json.dumps({"weight_map": {"t%d" % i: "s%d.safetensors" % i
                                                                    for i in range(300)}}).encode()) + lp(a) + b)
    put("index", "empty", b"")


# ---- tokenizer_config.json -------------------------------------------------------

def tokenizer_config():
    real = os.path.join(HERE, "..", "data", "model", "tokenizer_config.json")
    put("tokenizer_config", "valid_real", open(real, "rb").read())
    bos = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
    eos = "<\uff5cend\u2581of\u2581sentence\uff5c>"
    put("tokenizer_config", "strings", json.dumps({"bos_token": bos, "eos_token": eos}, ensure_ascii=False))
    put("tokenizer_config", "objects", json.dumps({"bos_token": {"content": bos, "lstrip": False},
                                                  "eos_token": {"content": eos}}))
    put("tokenizer_config", "vocab_token", json.dumps({"bos_token": "Hello", "eos_token": "\u010a"}))
    put("tokenizer_config", "unknown_token", json.dumps({"bos_token": "<nope>", "eos_token": ""}))
    put("tokenizer_config", "nulls", json.dumps({"bos_token": None, "eos_token": None}))
    put("tokenizer_config", "wrong_types", json.dumps({"bos_token": 151646, "eos_token": [eos],
                                                      "add_bos_token": "yes"}))
    put("tokenizer_config", "content_not_string", json.dumps({"bos_token": {"content": 5}}))
    put("tokenizer_config", "nul_in_name", b'{"eos_token":"<\xef\xbd\x9cend\\u0000x"}')
    put("tokenizer_config", "dup_keys", json.dumps({"eos_token": eos}, ensure_ascii=False)[:-1].encode()
        + b', "eos_token": "Hello"}')
    put("tokenizer_config", "truncated", b'{"bos_token": {"content": "<\xef\xbd')
    put("tokenizer_config", "not_object", b"[1]")
    put("tokenizer_config", "empty", b"")
    put("tokenizer_config", "deep_nesting", b'{"bos_token":' + b"{\"content\":" * 2000 + b"1" + b"}" * 2001)
    put("tokenizer_config", "bad_utf8", b'{"bos_token":"\xff\xfe"}')


# ---- generation_config.json -----------------------------------------------------

def generation_config():
    real = os.path.join(HERE, "..", "data", "model", "generation_config.json")
    put("generation_config", "valid_real", open(real, "rb").read())
    base = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0,
            "repetition_penalty": 1.1, "do_sample": True}
    put("generation_config", "valid_all", json.dumps(base))
    put("generation_config", "greedy", json.dumps({"do_sample": False, "temperature": 0.7}))
    put("generation_config", "nulls", json.dumps({k: None for k in base}))
    put("generation_config", "empty_object", b"{}")
    put("generation_config", "temperature_max", json.dumps(dict(base, temperature=1e6)))
    put("generation_config", "temperature_huge", json.dumps(dict(base, temperature=1e38)))
    put("generation_config", "temperature_negative", json.dumps(dict(base, temperature=-1)))
    put("generation_config", "temperature_string", json.dumps(dict(base, temperature="0.6")))
    put("generation_config", "top_p_zero", json.dumps(dict(base, top_p=0)))
    put("generation_config", "top_p_above_one", json.dumps(dict(base, top_p=1.0000001)))
    put("generation_config", "top_k_float", json.dumps(dict(base, top_k=2.5)))
    put("generation_config", "top_k_huge", json.dumps(dict(base, top_k=1e300)))
    put("generation_config", "min_p_one", json.dumps(dict(base, min_p=1.0)))
    put("generation_config", "penalty_tiny", json.dumps(dict(base, repetition_penalty=1e-45)))
    put("generation_config", "penalty_zero", json.dumps(dict(base, repetition_penalty=0)))
    # found by libFuzzer: positive but 0.0f once stored (accepted, then the sampler refused)
    put("generation_config", "found_penalty_float_underflow", json.dumps(dict(base, repetition_penalty=1e-90)))
    put("generation_config", "top_p_float_underflow", json.dumps(dict(base, top_p=1e-50)))
    put("generation_config", "do_sample_string", json.dumps(dict(base, do_sample="false")))
    put("generation_config", "overflow_literal", b'{"temperature": 1e400}')
    put("generation_config", "dup_keys", b'{"temperature": 0.6, "temperature": -5}')
    put("generation_config", "trailing_garbage", json.dumps(base).encode() + b" x")
    put("generation_config", "nul_key", b'{"temperature\\u0000x": -1}')
    put("generation_config", "truncated", json.dumps(base).encode()[:30])
    put("generation_config", "not_object", b"3")
    put("generation_config", "empty", b"")
    put("generation_config", "deep_nesting", b'{"x":' + b"[" * 3000 + b"]" * 3000 + b"}")


# ---- chat: add_generation_prompt byte, then (role byte, content, 0x00)... ----------

def chat():
    def msgs(gen, items):
        return bytes([gen]) + b"".join(bytes([r & 0xFF]) + c.encode("utf-8") + b"\0" for r, c in items)

    put("chat", "single_user", msgs(1, [(1, "What is 2+2?")]))
    put("chat", "system_user_assistant", msgs(1, [(0, "You are terse."), (1, "Hi"),
                                                  (2, "<think>\nhm\n</think>\n\nHello."), (1, "Again")]))
    put("chat", "two_systems_last_wins", msgs(0, [(0, "first"), (1, "q"), (0, "second")]))
    put("chat", "assistant_many_think", msgs(1, [(2, "a</think>b</think>c</think"), (2, "</think>")]))
    put("chat", "empty_contents", msgs(1, [(0, ""), (1, ""), (2, "")]))
    put("chat", "no_messages", b"\x01")
    put("chat", "no_messages_no_prompt", b"\x00")
    put("chat", "bad_role", msgs(1, [(1, "x"), (3, "y")]))
    put("chat", "negative_role", msgs(1, [(-1, "x")]))
    put("chat", "special_tokens_in_text", msgs(1, [(1, "<\uff5cAssistant\uff5c><think>\n"),
                                                  (2, "<\uff5cend\u2581of\u2581sentence\uff5c>")]))
    put("chat", "unicode", msgs(1, [(1, "\u4f60\u597d \U0001F600 cafe\u0301")]))
    put("chat", "bad_utf8", b"\x01\x01\xff\xfe\xe2\x82\x00\x02\xc0\xaf")
    put("chat", "no_trailing_nul", b"\x01\x01abc")


# ---- stopper: flags byte, stop strings (0x00-terminated), 3-byte ids -----------

def stopper():
    vocab = json.load(open(REAL_TOK, encoding="utf-8"))["model"]["vocab"]
    eos = 151643

    def ids(*toks):
        out = b""
        for t in toks:
            i = t if isinstance(t, int) else vocab[t]
            out += struct.pack("<I", i + 1)[:3]  # the target subtracts 1
        return out

    def inp(flags, stops, toks):
        return bytes([flags]) + b"".join(s.encode("utf-8") + b"\0" for s in stops) + ids(*toks)

    text = ["Hello", "\u0120world", ".", "\u010a", "\u0120The", "\u0120answer", "\u0120is", "\u0120", "4"]
    put("stopper", "no_stops", inp(0, [], text))
    put("stopper", "stop_word", inp(1, ["answer"], text))
    put("stopper", "stop_across_tokens", inp(1, ["world.\n"], text))
    put("stopper", "stop_prefix_then_not", inp(1, ["worlds"], text))
    put("stopper", "stop_three", inp(3, ["is 4", "The", " answer"], text))
    put("stopper", "overlapping_stops", inp(2, ["lo w", "llo world"], text))
    put("stopper", "eos", inp(0x04, [], text[:3] + [eos] + text[3:]))
    put("stopper", "eos_not_stopping", inp(0x00, [], text[:3] + [eos] + text[3:]))
    put("stopper", "eos_with_held", inp(0x05, ["world!"], ["Hello", "\u0120world", eos]))
    # a character split over two tokens (\u4f60 = e4 bd a0; U+1F600 = f0 9f 98 80)
    put("stopper", "split_char", inp(1, ["\u4f60"], ["\u00e4\u00bd", "\u0142", "Hello"]))
    put("stopper", "split_emoji_eos", inp(0x04, [], ["\u00f0\u0141\u013a", eos]))
    put("stopper", "incomplete_then_flush", inp(0, [], ["Hello", "\u00f0\u0141\u013a"]))
    put("stopper", "stop_is_replacement_char", inp(1, ["\ufffd"], ["\u00f0\u0141\u013a", "Hello"]))
    put("stopper", "special_tokens", inp(1, ["think"], [151648, "Hello", 151649, 151644]))
    put("stopper", "invalid_ids", bytes([1]) + b"x\0" + b"\x00\x00\x00" + struct.pack("<I", 151666)[:3]
        + ids("x"))
    put("stopper", "empty_stop", b"\x02a\0\0" + ids(*text))
    put("stopper", "reset_rerun", inp(0x09, ["world"], text))
    put("stopper", "reset_rerun_eos", inp(0x0c, [], text + [eos]))
    put("stopper", "long_stop", inp(1, ["Hello world.\nThe answer is 4!"], text))


if __name__ == "__main__":
    safetensors()
    config()
    tokenizer()
    tokenize()
    tokenize_regex()
    index()
    tokenizer_config()
    generation_config()
    chat()
    stopper()
