#!/usr/bin/env python3
"""Generate tests/data/tokenizer_vectors.json from Hugging Face `tokenizers`.

Usage:  pip install tokenizers
        python3 tests/make_tokenizer_vectors.py [tokenizer.json] [out.json]
        (defaults: tests/data/model/tokenizer.json, tests/data/tokenizer_vectors.json)

Every expected value in the output comes from HF `tokenizers` run on the
model's tokenizer.json; nothing is hand-written.  Texts are stored as hex so
that NUL bytes and invalid UTF-8 survive any JSON parser.

Output layout:
  tokenizers_version: the HF version used
  vectors: list of
    hex         - the input bytes (may be invalid UTF-8)
    valid       - 1 if the bytes are valid UTF-8
    ids         - HF encode(text, add_special_tokens=False), where text is the
                  bytes decoded with errors="replace" (what dsq_tokenize does)
    ids_bos     - same with add_special_tokens=True (omitted if equal to
                  [bos] + ids)
    ids_plain   - added tokens treated as plain text (HF with the added-token
                  list emptied); omitted when equal to ids
    decode      - hex of HF decode(ids) (skip_special_tokens=False)
    decode_skip - hex of HF decode(ids, skip_special_tokens=True); omitted
                  when equal to decode
  variants: tokenizer.json with some added-token flags changed (lstrip,
    rstrip, single_word, normalized, content) to check the HF matching rules
    on flags the shipped file does not use: patch (list of added-token
    fields to overwrite, by id) + vectors (hex, ids).
  accessors: n_tokens (vocab size with added tokens), id_to_token pairs, and
    strings that are no token.
  bulk: a ~1 MB text built as (all valid vector texts joined by "\n") repeated
    `repeat` times; n_ids and the FNV-1a 64 hash of its HF ids (little-endian
    int32 bytes) check the large-input path.
"""
import json
import os
import random
import sys

import tokenizers
from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
# tests/data/model/tokenizer.json is a byte-identical copy of the model's file
SRC = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "data/model/tokenizer.json")
OUT = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "data/tokenizer_vectors.json")

with open(SRC, encoding="utf-8") as f:
    TJ = json.load(f)
TOK = Tokenizer.from_str(json.dumps(TJ))
PLAIN = dict(TJ)
PLAIN["added_tokens"] = []
TOK_PLAIN = Tokenizer.from_str(json.dumps(PLAIN))
ADDED = [t["content"] for t in TJ["added_tokens"]]
BOS = TOK.token_to_id("<｜begin▁of▁sentence｜>")

# ---- the texts -------------------------------------------------------------
T = []  # str or bytes (bytes = possibly invalid UTF-8)

T += [
    "", "Hello world", " Hello world", "Hello, world!", "hello", " ", "  ", "a",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces", "trailing spaces   ", "  both  ", "\tTab\tseparated\t",
    "line1\nline2\r\nline3\rline4", "\n\n\n", "\r\n\r\n", " \n \n ", "a \t \n b",
    "end with newline\n", "   \t\t  \r\n  x", "x\n\n\ty", "    indented code",
    # contractions in mixed case
    "I'M here", "don'T", "we'Re", "They'LL", "you'Ve", "she'D", "it'S", "can't",
    "I'm", "DON'T STOP", "we're", "'s", "'S'T'RE", "'ll've'd", "rock'n'roll",
    "'hello'", "O'Neil's", "l'été", "a'ſ", "'Ｓ",
    # digits
    "12345678901234567890", "3.14159265358979", "1,000,000", "year 2024", "x1y2z3",
    "٠١٢٣٤٥٦٧٨٩", "①②③", "Ⅻ", "0x7fffffff", "1e-10", "+-*/=",
    # code and URLs
    "def f(x):\n    return x * 2\n",
    "int main(void) { printf(\"%d\\n\", 42); return 0; }",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "#include <stdio.h>", "x = [1, 2, 3]  # comment", "if (a && b || !c) return;",
    "SELECT * FROM users WHERE id = 1;", "<div class=\"x\">Hi</div>",
    "https://example.com/path?query=1&b=two#frag", "http://www.google.com/",
    "user@example.com", "C:\\Program Files\\x.exe", "~/.bashrc && ls -la",
    "{\"key\": [1, 2.5, null, true]}", "a_b_c __init__ self.x_y",
    "camelCaseIdentifier snake_case_identifier SCREAMING_CASE",
    "$$\\frac{a}{b}$$", "λx.x", "x := y; z <- w", "....", "!!!???", "---===---",
    "\"quoted\" 'single'", "(parens) [brackets] {braces}", "a\\b\\c",
    # languages
    "你好，世界！", "我爱北京天安门。", "今天天气很好，我们去公园散步吧。",
    "中文English混合text", "日本語のテキストです。", "こんにちは、世界", "カタカナとひらがな",
    "한국어 텍스트", "안녕하세요 세계", "العربية لغة جميلة", "مرحبا بالعالم",
    "हिन्दी भाषा", "नमस्ते दुनिया", "Русский текст", "Привет, мир!", "Ελληνικά",
    "עברית", "ไทย ภาษา", "Tiếng Việt có dấu", "Ümlaut ÄÖÜ äöü ß", "naïve café résumé",
    "Ærøskøbing", "español ñ ¿qué?", "Türkçe ığüşöç İ", "ქართული", "Հայերեն", "ᠮᠣᠩᠭᠣᠯ",
    "ⲁⲃⲅ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝟙𝟚𝟛", "ｆｕｌｌｗｉｄｔｈ", "ｶﾀｶﾅ",
    # emoji
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "👩🏿‍💻", "🇺🇸🇯🇵", "❤️", "I ❤️ NY", "emoji😀in😀text",
    "🤷‍♀️🤷🏻‍♂️", "✊🏾✋🏼", "🧑‍🤝‍🧑", "1️⃣ #️⃣", "©®™",
    # combining characters, NFC vs not
    "e\u0301", "cafe\u0301", "A\u030A", "n\u0303", "u\u0308ber", "\u1100\u1161\u11a8",
    "o\u0302\u0301", "a\u0328\u0301", "\u0301", "x\u0301\u0301\u0301", "s\u0323\u0307",
    "\u212b", "\u2126", "\u00c5", "\uFB01", "\u0958", "\u0915\u093c",
    "Å", "\u0041\u030A\u0301", "q\u0307\u0323", "ǅ", "\u0f73", "\u2000x",
    # whitespace variety (checks the regex's \s)
    "a\u00a0b", "a \u00a0b", "a\u0085b", "\u0085hello", "x \u0085y", "a\u2028b", "a\u2029 b",
    "a\u3000b", "\u3000\u3000text", "a\u1680b", "a\u2003b c\u2009d", "a\u202fb",
    "a\u205fb", "x\u180ey", "x\u200by", "x\ufeffy", "a\x0bb \x0b b", "a \x0cb",
    "\x1c\x1d\x1e\x1f hi", "tab\t\t\ttabs", " \t", "\t ", "x  \n  y", "x \n\n y",
    " " * 40, "\n" * 10, "a" + " " * 17 + "b", "\t" * 9 + "x",
    # controls, NUL, odd code points
    "a\x00b", "\x00", "\x01\x02\x03", "\x7f", "\u00ad", "\ufffd", "\U0010ffff",
    "\ue000", "\U0001F600\U0001F600\U0001F600", "\u200d", "\u2060",
    # a long word and long runs
    "a" * 300, "ab" * 200, "1" * 257, "!" * 100, "数" * 120, "😀" * 50,
    "Supercalifragilisticexpialidocious" * 5,
    "The " * 100,
]

# Characters on which regex engines disagree about \s (U+180E, U+0085, ...):
# put them where a different split changes the merges (" \u180eb").
for w in ["\u0085", "\u00a0", "\u1680", "\u180e", "\u2000", "\u2007", "\u200a", "\u200b",
          "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\ufeff", "\x1c", "\x1f", "\x0b",
          "\x0c"]:
    T += ["a " + w + "b", "a" + w + w + "b", w + " x", "x " + w, "1" + w + "2", w + "\n", "!" + w + "?",
          " " + w + " " + w]

# every added token, alone and next to text
for a in ADDED:
    T += [a, "x" + a + "y", " " + a + " ", a + a, "\n" + a + "\n"]
T += [
    "<｜begin▁of▁sentence｜><｜User｜>Hello, world!<｜Assistant｜>",
    "<｜begin▁of▁sentence｜>You are helpful.<｜User｜>What is 2+2?<｜Assistant｜><think>\n",
    "<think>\nLet me think.\n</think>\n\nThe answer is 4.<｜end▁of▁sentence｜>",
    "<|im_start|>user<|im_end|>", "<｜User", "<think", "think>", "<｜end▁of▁sentence",
    "<<think>>", "<｜User｜｜>", "</think></think>", "<tool_call>{\"a\":1}</tool_call>",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>", "<|vision_start|><|image_pad|><|vision_end|>",
]

# invalid UTF-8 (bytes)
T += [
    b"\xff", b"a\xffb", b"\x80", b"\xc3", b"\xc3(", b"caf\xe9", b"\xe2\x82", b"\xe2\x82(",
    b"\xf0\x9f\x98", b"\xf0\x9f\x98 ok", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf8\x88\x80\x80\x80",
    b"\xf4\x90\x80\x80", b"\xe0\x80\x80", b"ok\xfe\xfe\xffok", b"\x80\x80\x80abc",
    b"Hello \xf0\x28\x8c\x28 world", b"\xef\xbb\xbfBOM", b"<\xef\xbd\x9cUser\xef\xbd\x9c>\xff",
]


def rand_text(rng):
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789", " ", "  \t\n\r", ".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`",
        "你好世界中文字符测试", "こんにちはカタカナ", "한국어텍스트", "مرحبا", "नमस्ते",
        "éèêëàâäôöûüçñß", "\u0301\u0308\u0323\u0303", "😀👍🏽❤️\u200d🔥", "'s't're've'm'll'd'S'T",
        "\u00a0\u3000\u2003\u0085",
    ]
    n = rng.randint(1, 60)
    out = []
    for _ in range(n):
        p = rng.choice(pools)
        out.append(rng.choice(p))
    if rng.random() < 0.2:
        out.insert(rng.randint(0, len(out)), rng.choice(ADDED))
    return "".join(out)


rng = random.Random(20240601)
T += [rand_text(rng) for _ in range(150)]


def enc(tok, text, add):
    return tok.encode(text, add_special_tokens=add).ids


def vec_for(item):
    raw = item if isinstance(item, bytes) else item.encode("utf-8")
    text = raw.decode("utf-8", errors="replace")
    valid = True
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        valid = False
    ids = enc(TOK, text, False)
    v = {"hex": raw.hex(), "valid": int(valid), "ids": ids}
    ids_bos = enc(TOK, text, True)
    if ids_bos != [BOS] + ids:
        v["ids_bos"] = ids_bos
    ids_plain = enc(TOK_PLAIN, text, False)
    if ids_plain != ids:
        v["ids_plain"] = ids_plain
    d = TOK.decode(ids, skip_special_tokens=False)
    v["decode"] = d.encode("utf-8").hex()
    ds = TOK.decode(ids, skip_special_tokens=True)
    if ds != d:
        v["decode_skip"] = ds.encode("utf-8").hex()
    return v


seen = set()
vectors = []
for item in T:
    key = item if isinstance(item, bytes) else item.encode("utf-8")
    if key in seen:
        continue
    seen.add(key)
    vectors.append(vec_for(item))

# ---- variants: added-token flags the shipped file does not use -------------
def variant(patch, texts):
    vj = json.loads(json.dumps(TJ))
    for p in patch:
        for t in vj["added_tokens"]:
            if t["id"] == p["id"]:
                t.update({k: v for k, v in p.items() if k != "id"})
    vt = Tokenizer.from_str(json.dumps(vj))
    return {"patch": patch,
            "vectors": [{"hex": s.encode("utf-8").hex(), "ids": enc(vt, s, False)} for s in texts]}


variants = [
    variant([{"id": 151648, "lstrip": True}, {"id": 151649, "rstrip": True}],
            ["a <think> b </think> c", "x\t\t<think>y", "</think>\n\n z", "  <think>  </think>  ",
             "<think></think>", " </think> <think> ", "a\u3000<think>\u3000b", "<think> </think>"]),
    variant([{"id": 151657, "single_word": True}, {"id": 151658, "single_word": True, "lstrip": True,
                                                    "rstrip": True}],
            ["<tool_call> x", "a<tool_call>", "a <tool_call> b", "<tool_call>b", "é<tool_call>",
             "-<tool_call>-", "_<tool_call>", "x </tool_call> y", "x</tool_call> y",
             "<tool_call></tool_call>", "1<tool_call>", " <tool_call>\u0301"]),
    variant([{"id": 151663, "content": "café", "normalized": True},
             {"id": 151664, "content": "Ω", "normalized": False}],
            ["café", "cafe\u0301", "un café noir", "Ω", "\u2126", "Ωcafé\u2126", "cafe"]),
]

# ---- bulk: ~1 MB ------------------------------------------------------------
valid_texts = [bytes.fromhex(v["hex"]).decode("utf-8") for v in vectors if v["valid"]]
unit = "\n".join(valid_texts)
repeat = max(1, (1 << 20) // len(unit.encode("utf-8")) + 1)
bulk_text = unit * repeat
bulk_ids = TOK.encode(bulk_text, add_special_tokens=False).ids
h = 0xcbf29ce484222325
for i in bulk_ids:
    for b in int(i).to_bytes(4, "little", signed=True):
        h ^= b
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF

# ---- accessors: id <-> token text as HF reports them --------------------------
sample_ids = [0, 1, 11, 198, 220, 1879, 9707, 21927, 100000, 151642] + list(range(151643, 151665))
accessors = {
    "n_tokens": TOK.get_vocab_size(with_added_tokens=True),
    "id_to_token": [[i, TOK.id_to_token(i)] for i in sample_ids],
    "absent": [TOK.token_to_id(s) is None and s for s in ["no such token", "Hello world"]],
}

out = {
    "tokenizers_version": tokenizers.__version__,
    "accessors": accessors,
    "source": "HF tokenizers on tests/data/model/tokenizer.json (DeepSeek-R1-Distill-Qwen-1.5B)",
    "bos": BOS,
    "vectors": vectors,
    "variants": variants,
    "bulk": {"repeat": repeat, "bytes": len(bulk_text.encode("utf-8")), "n_ids": len(bulk_ids),
             "fnv1a64": "%016x" % h},
}
with open(OUT, "w", encoding="utf-8") as f:
    json.dump(out, f, separators=(",", ":"))
    f.write("\n")
print("wrote %s: %d vectors, %d variants, bulk %d bytes -> %d ids" %
      (OUT, len(vectors), len(variants), out["bulk"]["bytes"], len(bulk_ids)))
