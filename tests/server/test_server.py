#!/usr/bin/env python3
"""`dsqwen serve` end to end on the CPU: servers started on free loopback
ports, driven with curl, the standard library's http.client and (part
`openai`) the real `openai` Python client.

    python3 test_server.py DSQWEN DEMO_MODEL_DIR PART [--venv DIR] [--asan]

PART is `http` (curl / http.client: both endpoints streaming and not, stop
strings, logprobs, seeds, prefix cache, cancellation, 429, malformed
requests, auth, a 32-client load test with a flat RSS, shutdown) or `openai`
(the openai package; installed from PyPI into the venv DIR when the running
python lacks it; exit 77 = SKIP when it cannot be had).  DEMO_MODEL_DIR is
made by scripts/make_demo_model.py (real tokenizer, random weights: the text
is gibberish, so the checks compare the server with itself, never with
expected words).  --asan: the binary is an AddressSanitizer build (slower;
RSS is not compared, LeakSanitizer's verdict is the exit status checked at
shutdown).  Exit 0 all passed, 1 a failure, 77 skipped.
"""
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

DSQWEN, MODEL, PART = sys.argv[1], sys.argv[2], sys.argv[3]
VENV = sys.argv[sys.argv.index("--venv") + 1] if "--venv" in sys.argv else None
# under a sanitizer (--asan from ctest's ASan build, --sanitized from the
# TSan run in scripts/test.sh): more time, no RSS comparison
ASAN = "--asan" in sys.argv or "--sanitized" in sys.argv
KEY = "test-key-123"
SLOW = 4 if ASAN else 1


def check(cond, what, *context):
    if not cond:
        raise AssertionError(what + "".join("\n--- " + str(c)[:2000] for c in context))


class Server:
    """A `dsqwen serve` process on a free port (--port 0; the port is read
    from its 'listening on' line)."""

    def __init__(self, *args, key=KEY):
        cmd = [DSQWEN, "serve", "--model", MODEL, "--backend", "cpu", "--port", "0",
               "--threads", "2", "--served-model-name", "demo-model"] + list(args)
        if key:
            cmd += ["--api-key", key]
        self.key = key
        self.log = open(os.devnull, "w")
        self.p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.err_lines = []
        self.port = None
        deadline = time.time() + 120 * SLOW
        while time.time() < deadline:
            line = self.p.stderr.readline().decode(errors="replace")
            if not line:
                break
            self.err_lines.append(line)
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        check(self.port, "server did not start", "".join(self.err_lines))
        # keep draining stderr so the server never blocks on a full pipe
        self.t = threading.Thread(target=self._drain, daemon=True)
        self.t.start()

    def _drain(self):
        for line in self.p.stderr:
            self.err_lines.append(line.decode(errors="replace"))

    @property
    def base(self):
        return f"http://127.0.0.1:{self.port}"

    def headers(self, key=None):
        h = {"Content-Type": "application/json"}
        k = self.key if key is None else key
        if k:
            h["Authorization"] = "Bearer " + k
        return h

    def request(self, method, path, body=None, key=None, raw=None, timeout=120):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout * SLOW)
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        c.request(method, path, body=data, headers=self.headers(key))
        r = c.getresponse()
        text = r.read().decode()
        c.close()
        return r.status, dict(r.getheaders()), text

    def post(self, path, body, **kw):
        st, h, text = self.request("POST", path, body, **kw)
        try:
            js = json.loads(text)
        except ValueError:
            js = None
        return st, h, js, text

    def stream(self, path, body):
        """POST with stream: returns (status, [parsed chunks], saw_done)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120 * SLOW)
        c.request("POST", path, body=json.dumps(body), headers=self.headers())
        r = c.getresponse()
        if r.status != 200:
            text = r.read().decode()
            c.close()
            return r.status, text, False
        chunks, done = [], False
        for line in r:
            line = line.decode().rstrip("\n")
            if not line:
                continue
            check(line.startswith("data: "), "not an SSE data line", line)
            payload = line[6:]
            if payload == "[DONE]":
                done = True
                continue
            check(not done, "data after [DONE]", line)
            chunks.append(json.loads(payload))
        c.close()
        return 200, chunks, done

    def metrics(self):
        st, _, text = self.request("GET", "/metrics")
        check(st == 200, "/metrics failed", text)
        m = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, val = line.rsplit(" ", 1)
            m[name] = float(val)
        return m

    def rss_kb(self):
        with open(f"/proc/{self.p.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self, sig=signal.SIGTERM):
        self.p.send_signal(sig)
        try:
            rc = self.p.wait(timeout=60 * SLOW)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            raise AssertionError("server did not stop after the signal")
        self.t.join(timeout=5)
        return rc

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def wait_for(cond, what, timeout=20):
    deadline = time.time() + timeout * SLOW
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def err_field(js):
    check(js and isinstance(js.get("error"), dict), "no OpenAI error object", js)
    e = js["error"]
    for k in ("message", "type", "param", "code"):
        check(k in e, f"error object lacks '{k}'", js)
    return e


CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"


def chat_body(text, **kw):
    b = {"model": "demo-model", "messages": [{"role": "user", "content": text}]}
    b.update(kw)
    return b


# ---- the http part ------------------------------------------------------------

def test_basics(s):
    st, _, text = s.request("GET", "/health", key="")
    check(st == 200 and json.loads(text)["status"] == "ok", "/health", text)
    st, _, text = s.request("GET", "/v1/models")
    check(st == 200, "/v1/models", text)
    models = json.loads(text)
    check(models["object"] == "list" and models["data"][0]["object"] == "model" and
          models["data"][0]["id"] == "demo-model", "models (--served-model-name)", text)
    st, _, text = s.request("GET", "/nope")
    check(st == 404, "unknown path is 404", st, text)
    err_field(json.loads(text))
    st, _, text = s.request("GET", CHAT)
    check(st == 405, "GET on a POST endpoint is 405", st, text)


def test_keepalive(s):
    """GET /health, /metrics, /v1/models keep the connection open (HTTP/1.1
    keep-alive, as Prometheus, probes and the openai client's pool use it),
    and pipelined GETs are all answered."""
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60 * SLOW)
    sock = None
    for path in ("/health", "/metrics", "/v1/models", "/nope", "/health"):
        c.request("GET", path, headers=s.headers())
        r = c.getresponse()
        r.read()
        check(r.status in (200, 404), f"GET {path}", r.status)
        check((r.getheader("Connection") or "").lower() != "close", f"GET {path} closed the "
              "connection", r.getheaders())
        check(sock is None or c.sock is sock, f"GET {path}: a new connection was made")
        sock = c.sock
    st, _, js, text = s.post(CHAT, chat_body("hi", max_tokens=2))
    check(st == 200, "POST after GETs", text)
    c.close()
    raw = socket.create_connection(("127.0.0.1", s.port), timeout=60 * SLOW)
    raw.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 2 +
                b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    got = b""
    while True:
        b = raw.recv(65536)
        if not b:
            break
        got += b
    raw.close()
    check(got.count(b"HTTP/1.1 200") == 3, "three pipelined GETs answered", got)


def test_auth(s):
    for key in ("", "wrong-key"):
        st, _, js, text = s.post(CHAT, chat_body("hi", max_tokens=2), key=key)
        check(st == 401, f"key {key!r}: expected 401", st, text)
        check(err_field(js)["code"] == "invalid_api_key", "401 code", text)
    st, _, _ = s.request("GET", "/v1/models", key="")
    check(st == 401, "models without a key")
    # curl, as a user would
    out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", s.base + CHAT,
                          "-H", "Content-Type: application/json", "-d",
                          json.dumps(chat_body("hi", max_tokens=2))],
                         capture_output=True, text=True, timeout=60 * SLOW)
    check(out.stdout == "401", "curl without key", out.stdout, out.stderr)


def test_chat_nonstream(s):
    st, _, js, text = s.post(CHAT, chat_body("Tell me a story", max_tokens=12, seed=3))
    check(st == 200, "chat", st, text)
    check(js["object"] == "chat.completion" and js["id"].startswith("chatcmpl-"), "object", js)
    ch = js["choices"][0]
    check(ch["message"]["role"] == "assistant", "role", js)
    check("reasoning_content" in ch["message"] and "content" in ch["message"], "fields", js)
    check(ch["finish_reason"] in ("stop", "length"), "finish_reason", js)
    u = js["usage"]
    check(u["prompt_tokens"] > 0 and 0 < u["completion_tokens"] <= 12 and
          u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], "usage", js)
    if ch["finish_reason"] == "length":
        check(u["completion_tokens"] == 12, "length after max_tokens", js)
    # max_completion_tokens is honoured too
    st, _, js, text = s.post(CHAT, chat_body("x", max_completion_tokens=3, temperature=0))
    check(st == 200 and js["usage"]["completion_tokens"] <= 3, "max_completion_tokens", text)


def collect_chat_stream(chunks):
    content = reasoning = ""
    finish = None
    for c in chunks:
        for ch in c["choices"]:
            d = ch["delta"]
            content += d.get("content") or ""
            reasoning += d.get("reasoning_content") or ""
            finish = ch["finish_reason"] or finish
    return content, reasoning, finish


def test_chat_stream(s):
    body = chat_body("Count to ten", max_tokens=10, temperature=0, stream=True,
                     stream_options={"include_usage": True})
    st, chunks, done = s.stream(CHAT, body)
    check(st == 200 and done, "stream ends with data: [DONE]", st, chunks)
    check(chunks[0]["object"] == "chat.completion.chunk", "chunk object", chunks[0])
    check(chunks[0]["choices"][0]["delta"].get("role") == "assistant", "role first", chunks[0])
    check(chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] <= 10,
          "include_usage: a last chunk with usage and no choices", chunks[-1])
    content, reasoning, finish = collect_chat_stream(chunks[:-1])
    check(finish in ("stop", "length"), "finish_reason", chunks)
    # the same request unstreamed gives the same text (greedy)
    body.pop("stream")
    body.pop("stream_options")
    st, _, js, text = s.post(CHAT, body)
    m = js["choices"][0]["message"]
    check(m["content"] == content and m["reasoning_content"] == reasoning,
          "streamed text == unstreamed text", m, (content, reasoning))
    # without include_usage the finishing chunk carries usage
    st, chunks, done = s.stream(CHAT, chat_body("hi", max_tokens=3, stream=True))
    check(done and chunks[-1]["choices"][0]["finish_reason"] and "usage" in chunks[-1],
          "usage in the finishing chunk", chunks[-1])
    # curl -N, as a user would
    out = subprocess.run(["curl", "-sN", s.base + CHAT, "-H", "Authorization: Bearer " + KEY,
                          "-d", json.dumps(chat_body("hi", max_tokens=4, stream=True))],
                         capture_output=True, text=True, timeout=60 * SLOW)
    check(out.returncode == 0 and out.stdout.rstrip().endswith("data: [DONE]"),
          "curl stream ends with [DONE]", out.stdout, out.stderr)


def test_completions(s):
    st, _, js, text = s.post(CMPL, {"prompt": "Once upon a time", "max_tokens": 8,
                                    "temperature": 0})
    check(st == 200 and js["object"] == "text_completion", "completion", text)
    ref = js["choices"][0]["text"]
    st, chunks, done = s.stream(CMPL, {"prompt": "Once upon a time", "max_tokens": 8,
                                       "temperature": 0, "stream": True})
    check(done, "completion stream [DONE]", chunks)
    streamed = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    check(streamed == ref, "streamed == unstreamed completion", streamed, ref)
    # a prompt given as token ids, and as a list of one string
    st, _, js, text = s.post(CMPL, {"prompt": [9707, 1879, 0], "max_tokens": 2})
    check(st == 200 and js["usage"]["prompt_tokens"] == 3, "token-id prompt, taken as is", text)
    st, _, js, text = s.post(CMPL, {"prompt": ["Once upon a time"], "max_tokens": 8,
                                    "temperature": 0})
    check(st == 200 and js["choices"][0]["text"] == ref, "list of one prompt", text)


def test_stop_strings(s):
    # the reference: the same greedy completion without stop strings
    body = {"prompt": "The quick brown fox", "max_tokens": 40, "temperature": 0}
    st, _, js, text = s.post(CMPL, body)
    full = js["choices"][0]["text"]
    check(len(full) >= 24, "need a longer reference text", full)
    stop = full[12:16]
    cut = full.find(stop)
    for stream in (False, True):
        b = dict(body, stop=[stop, "\u2603never"], stream=stream)
        if stream:
            st, chunks, done = s.stream(CMPL, b)
            got = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
            fin = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
        else:
            st, _, js, text = s.post(CMPL, b)
            got, fin = js["choices"][0]["text"], js["choices"][0]["finish_reason"]
        check(got == full[:cut], f"stop {stop!r} (stream={stream}) cuts the text", got, full)
        check(fin == "stop", "finish_reason stop", fin)
    # a single string works as well
    st, _, js, text = s.post(CMPL, dict(body, stop=stop))
    check(js["choices"][0]["text"] == full[:cut], "stop as a string", text)


def test_logprobs(s):
    st, _, js, text = s.post(CHAT, chat_body("hello", max_tokens=5, temperature=0,
                                             logprobs=True, top_logprobs=3))
    check(st == 200, "chat logprobs", text)
    content = js["choices"][0]["logprobs"]["content"]
    check(len(content) == js["usage"]["completion_tokens"], "one entry per token", js)
    for e in content:
        tops = e["top_logprobs"]
        check(len(tops) == 3, "3 top logprobs", e)
        lps = [t["logprob"] for t in tops]
        check(lps == sorted(lps, reverse=True) and all(x <= 0 for x in lps), "sorted, <= 0", e)
        # greedy: the sampled token is the most likely one
        check(e["token"] == tops[0]["token"] and abs(e["logprob"] - lps[0]) < 1e-6,
              "greedy token is top-1", e)
        try:
            check(bytes(e["bytes"]).decode() == e["token"], "token == its bytes", e)
        except UnicodeDecodeError:  # part of a character: the text has U+FFFD
            check("\ufffd" in e["token"], "partial UTF-8 shown as U+FFFD", e)
    st, _, js, text = s.post(CMPL, {"prompt": "hello", "max_tokens": 4, "temperature": 0,
                                    "logprobs": 2})
    lp = js["choices"][0]["logprobs"]
    n = js["usage"]["completion_tokens"]
    check(len(lp["tokens"]) == n and len(lp["token_logprobs"]) == n and
          len(lp["top_logprobs"]) == n and len(lp["text_offset"]) == n, "completion logprobs", lp)
    check(all(1 <= len(t) <= 2 for t in lp["top_logprobs"]), "top 2 per token", lp)
    # streamed chunks carry logprobs
    st, chunks, done = s.stream(CHAT, chat_body("hello", max_tokens=3, temperature=0,
                                                logprobs=True, stream=True))
    n = sum(len((c["choices"][0].get("logprobs") or {}).get("content") or [])
            for c in chunks if c["choices"])
    check(n == 3, "3 streamed logprob entries", chunks)
    # streamed logprobs (written directly, not through cJSON) equal the
    # whole reply's, entry for entry: chat with top-3, completions with top-2
    # (greedy, so both runs sample the same tokens)
    b = chat_body("tell me about logs", max_tokens=24, temperature=0, logprobs=True, top_logprobs=3)
    whole = s.post(CHAT, b)[2]["choices"][0]["logprobs"]["content"]
    st, chunks, done = s.stream(CHAT, dict(b, stream=True))
    streamed = [e for c in chunks if c["choices"]
                for e in ((c["choices"][0].get("logprobs") or {}).get("content") or [])]
    check(st == 200 and done and streamed == whole, "streamed chat logprobs == the reply's",
          streamed, whole)
    b = {"prompt": "tell me about logs", "max_tokens": 24, "temperature": 0, "logprobs": 2}
    whole = s.post(CMPL, b)[2]["choices"][0]["logprobs"]
    st, chunks, done = s.stream(CMPL, dict(b, stream=True))
    got = {k: [] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
    for c in chunks:
        if c["choices"] and c["choices"][0].get("logprobs"):
            for k in got:
                got[k] += c["choices"][0]["logprobs"][k]
    check(st == 200 and done and got == whole, "streamed completion logprobs == the reply's", got, whole)


def test_overlap_equal(main, ref):
    """The output worker (formatting step k's tokens beside step k+1, the
    default, `main`) and --no-overlap (`ref`) give the same replies: text,
    finish reason, usage, log-probs -- stop strings (found one step late
    with the overlap), max_tokens, streamed and not, concurrently."""
    base = {"prompt": "The quick brown fox", "max_tokens": 40, "temperature": 0}
    full = main.post(CMPL, base)[2]["choices"][0]["text"]
    stop = full[10:13] if len(full) >= 16 else "\u2603"
    bodies = [(CMPL, dict(base, stop=[stop], logprobs=1)),
              (CMPL, dict(base, max_tokens=7)),
              (CHAT, chat_body("count to ten", max_tokens=30, temperature=0, stop=["5"])),
              (CHAT, chat_body("hello there", max_tokens=12, temperature=0, logprobs=True,
                               top_logprobs=2))]

    def reply(srv, path, b, stream):
        if not stream:
            js = srv.post(path, dict(b, stream=False))[2]
            ch = js["choices"][0]
            text = ch.get("text") if path == CMPL else (ch["message"].get("reasoning_content") or "") + \
                "|" + (ch["message"].get("content") or "")
            return text, ch["finish_reason"], js["usage"]["completion_tokens"], ch["logprobs"]
        st, chunks, done = srv.stream(path, dict(b, stream=True, stream_options={"include_usage": True}))
        check(st == 200 and done, "stream completed", chunks)
        usage = [c["usage"] for c in chunks if c.get("usage")][-1]["completion_tokens"]
        fin = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
        if path == CMPL:
            text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        else:
            content, reasoning, _ = collect_chat_stream(chunks)
            text = reasoning + "|" + content
        return text, fin, usage, None

    results = {}

    def run(srv, key, path, b, stream):
        results[key] = reply(srv, path, b, stream)

    ts = []
    for i, (path, b) in enumerate(bodies):
        for stream in (False, True):
            for srv, name in ((main, "main"), (ref, "ref")):
                ts.append(threading.Thread(target=run, args=(srv, (name, i, stream), path, b, stream)))
    for t in ts:
        t.start()
    for t in ts:
        t.join(120 * SLOW)
    for i in range(len(bodies)):
        for stream in (False, True):
            a, r = results.get(("main", i, stream)), results.get(("ref", i, stream))
            check(a is not None and a == r, f"request {i} (stream={stream}): overlap == --no-overlap", a, r)
    check(results[("main", 0, False)][1] == "stop" or stop not in full[:10], "the stop string ended it",
          results[("main", 0, False)])
    check(results[("main", 1, True)][1:3] == ("length", 7), "max_tokens ends it at 7 tokens",
          results[("main", 1, True)])


def test_seed(s):
    b = chat_body("random words", max_tokens=12, temperature=1.0, seed=1234)
    a1 = s.post(CHAT, b)[2]["choices"][0]["message"]
    a2 = s.post(CHAT, b)[2]["choices"][0]["message"]
    check(a1 == a2, "same seed, same reply", a1, a2)
    texts = {json.dumps(s.post(CHAT, dict(b, seed=k))[2]["choices"][0]["message"])
             for k in range(4)}
    check(len(texts) > 1, "different seeds give different replies", texts)


def test_malformed(s):
    def bad(body, param=None, status=400, raw=None, path=CHAT, code=None):
        st, _, js, text = s.post(path, body, raw=raw)
        check(st == status, f"expected {status} for {raw or body}", st, text)
        e = err_field(js)
        if param:
            check(e["param"] == param, f"param {param}", text)
        if code:
            check(e["code"] == code, f"code {code}", text)

    bad(None, raw="{not json", code="invalid_json")
    bad(None, raw="[1,2]")
    bad(None, raw='{"messages": []} trailing', code="invalid_json")
    bad(None, raw="")
    bad(chat_body("x", max_tokens="ten"), "max_tokens")
    bad(chat_body("x", max_tokens=0), "max_tokens")
    bad(chat_body("x", temperature="hot"), "temperature")
    bad(chat_body("x", top_p=1.5), "top_p")
    bad(chat_body("x", stream="yes"), "stream")
    bad(chat_body("x", stop=5), "stop")
    bad(chat_body("x", ignore_eos="yes"), "ignore_eos")
    bad(chat_body("x", stop=["a", 3]), "stop")
    bad(chat_body("x", n=2), "n")
    bad(chat_body("x", top_logprobs=3), "top_logprobs")
    bad(chat_body("x", logprobs=True, top_logprobs=21), "top_logprobs")
    bad({"messages": "hello"}, "messages")
    bad({"messages": [{"role": "wizard", "content": "x"}]}, "messages")
    bad({"messages": [{"content": "x"}]}, "messages")
    bad({}, "messages")
    bad({"prompt": 5}, "prompt", path=CMPL)
    bad({"prompt": ["a", "b"]}, "prompt", path=CMPL)
    bad({"prompt": [1, 99999999]}, "prompt", path=CMPL)
    bad({"prompt": "x", "logprobs": 50}, "logprobs", path=CMPL)
    # a prompt longer than the context (--ctx 2048 here)
    bad({"prompt": "hello " * 3000}, "prompt", path=CMPL, code="context_length_exceeded")
    bad(chat_body("hello " * 3000), "messages", code="context_length_exceeded")
    # body over --max-body (65536)
    bad(None, status=413, raw=json.dumps(chat_body("y" * 70000)), code="body_too_large")
    # U+0000 in a string: refused (cJSON's C strings would end there and
    # drop the rest of the text without a word); an escaped backslash
    # followed by "u0000" is plain text
    bad(chat_body("a\u0000b", max_tokens=2), code="invalid_value")
    bad({"messages": [{"role": "user\u0000x", "content": "a"}]}, code="invalid_value")
    bad(None, raw='{"prompt": "a\x00b"}', path=CMPL, code="invalid_value")
    st, _, js, text = s.post(CHAT, chat_body("a\\u0000b", max_tokens=2))
    check(st == 200, "an escaped backslash before u0000 is text", text)
    # unknown fields are ignored
    st, _, js, text = s.post(CHAT, chat_body("x", max_tokens=2, frobnicate={"a": 1},
                                             user="me", logit_bias=None))
    check(st == 200, "unknown fields ignored", text)
    # the server still works
    st, _, js, text = s.post(CHAT, chat_body("x", max_tokens=2))
    check(st == 200, "after the bad requests", text)


def test_prefix_cache(s, ref):
    """A repeated system prompt is prefilled once: later requests fork it.
    Greedy replies equal those of a server without the cache (`ref`)."""
    system = "You are a careful assistant. " * 12  # ~ 70 tokens > --prefix-min 16
    before = s.metrics()["dsqwen_prefix_cache_hit_tokens_total"]
    outs = []
    for q in ("first question", "second question", "third question", "fourth one"):
        b = {"messages": [{"role": "system", "content": system},
                          {"role": "user", "content": q}], "max_tokens": 8, "temperature": 0}
        st, _, js, text = s.post(CHAT, b)
        check(st == 200, "prefix request", text)
        st2, _, js2, text2 = ref.post(CHAT, b)
        check(st2 == 200, "reference request", text2)
        check(js["choices"][0]["message"] == js2["choices"][0]["message"],
              "forked prefix gives the reply of a full prefill", js, js2)
        outs.append(js)
    m = s.metrics()
    hits = m["dsqwen_prefix_cache_hit_tokens_total"] - before
    check(m["dsqwen_prefill_tokens_total"] + m["dsqwen_prefix_cache_hit_tokens_total"] ==
          m["dsqwen_prompt_tokens_total"], "prefilled + cached = prompt tokens", m)
    check(hits >= 2 * 60, f"prefix cache used ({hits} tokens)", s.metrics())
    check(outs[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] >= 60,
          "usage reports cached tokens", outs[-1])


def test_prefix_eviction():
    """Three system prompts over two cache slots in a small pool, 72 mixed
    requests in waves of 24: all complete, and afterwards only the cached
    prefixes hold sequences and KV, no more than is reserved for them."""
    s = Server("--ctx", "256", "--max-seqs", "4", "--kv-pool-tokens", "512",
               "--prefix-cache", "2", "--prefix-min", "8", "--max-queue", "100", key=None)
    try:
        systems = [f"System prompt number {k}: " + "be helpful and precise. " * (3 + k)
                   for k in range(3)]
        res = []

        def client(i):
            r = random.Random(i)
            b = {"messages": [{"role": "system", "content": systems[r.randrange(3)]},
                              {"role": "user", "content": f"question {i}"}],
                 "max_tokens": r.randrange(1, 60), "stream": r.random() < 0.5}
            if b["stream"]:
                st, chunks, done = s.stream(CHAT, b)
                res.append((st, done))
            else:
                st, _, js, text = s.post(CHAT, b)
                res.append((st, True))

        for wave in range(3):
            ts = [threading.Thread(target=client, args=(wave * 100 + i,)) for i in range(24)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(timeout=300 * SLOW)
        check(len(res) == 72 and set(res) == {(200, True)}, "all 72 completed", res)
        m = s.metrics()
        check(m["dsqwen_prefix_cache_hit_tokens_total"] > 0 and
              m["dsqwen_prefix_cache_evictions_total"] > 0, "the cache was used and evicted", m)
        check(m["dsqwen_active_requests"] == 0 and
              m["dsqwen_sequences"] == m["dsqwen_prefix_cache_entries"] <= 2 and
              0 < m["dsqwen_kv_used_tokens"] <= m["dsqwen_kv_reserved_tokens"],
              "only cached prefixes hold KV, within what is reserved for them (less when "
              "an entry shares blocks with the entry it was forked from)", m)
        rc = s.stop()
        check(rc == 0, f"exit status {rc}", "".join(s.err_lines[-30:]))
    finally:
        s.kill()


def test_prefix_pool_deadlock():
    """A request that fits the empty pool alone, but not beside the cached
    prefix it would fork from (the entry's partial last block), is admitted
    (the entry dropped) instead of waiting forever at the head of the FIFO.
    Pool of 4 blocks of 16; entry = 20 tokens (2 blocks); the request needs
    64 tokens, 3 blocks of its own when forked: 2 + 3 > 4."""
    s = Server("--ctx", "64", "--max-seqs", "1", "--kv-pool-tokens", "64",
               "--prefix-cache", "1", "--prefix-min", "4", key=None)
    try:
        a = list(range(1000, 1020))
        for p in (a, a + [5]):  # the second one caches the shared 20 tokens
            st, _, js, text = s.post(CMPL, {"prompt": p, "max_tokens": 2})
            check(st == 200, "warm-up request", text)
        check(s.metrics()["dsqwen_prefix_cache_entries"] == 1, "a 20-token prefix cached",
              s.metrics())
        st, _, js, text = s.post(CMPL, {"prompt": a + [6], "max_tokens": 43, "ignore_eos": True},
                                 timeout=60)
        check(st == 200 and js["usage"]["completion_tokens"] == 43, "the pool-sized request ran",
              text)
        m = s.metrics()
        check(m["dsqwen_prefix_cache_evictions_total"] >= 1 and m["dsqwen_queue_length"] == 0 and
              m["dsqwen_sequences"] == m["dsqwen_prefix_cache_entries"], "entry dropped for it", m)
        rc = s.stop()
        check(rc == 0, f"exit status {rc}", "".join(s.err_lines[-30:]))
    finally:
        s.kill()


def test_cancellation(s):
    """A client that goes away mid-stream: its sequence is freed (metrics)."""
    m0 = s.metrics()
    sock = socket.create_connection(("127.0.0.1", s.port))
    body = json.dumps(chat_body("go on forever", max_tokens=1900, stream=True))
    sock.sendall((f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                  + body).encode())
    got = b""
    while got.count(b"data: ") < 3:
        chunk = sock.recv(4096)
        check(chunk, "stream ended early", got)
        got += chunk
    m1 = s.metrics()
    check(m1["dsqwen_active_requests"] == 1, "one active request", m1)
    sock.close()
    m2 = wait_for(lambda: (lambda m: m if m["dsqwen_active_requests"] == 0 else None)(s.metrics()),
                  "the cancelled request to leave")
    check(m2['dsqwen_requests_total{outcome="cancelled"}'] ==
          m0['dsqwen_requests_total{outcome="cancelled"}'] + 1, "counted as cancelled", m2)
    check(m2["dsqwen_generation_tokens_total"] - m1["dsqwen_generation_tokens_total"] < 200,
          "generation stopped soon after the disconnect", m1, m2)
    # only cached prefixes still hold sequences and KV
    check(m2["dsqwen_sequences"] == m2["dsqwen_prefix_cache_entries"], "sequence freed", m2)
    # a non-streaming client that disconnects is cancelled too
    sock = socket.create_connection(("127.0.0.1", s.port))
    body = json.dumps(chat_body("go on", max_tokens=1900))
    sock.sendall((f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n" + body).encode())
    wait_for(lambda: s.metrics()["dsqwen_active_requests"] == 1, "the request to start")
    sock.close()
    m3 = wait_for(lambda: (lambda m: m if m["dsqwen_active_requests"] == 0 else None)(s.metrics()),
                  "the non-streaming request to be cancelled")
    check(m3['dsqwen_requests_total{outcome="cancelled"}'] ==
          m0['dsqwen_requests_total{outcome="cancelled"}'] + 2, "cancelled twice", m3)


def test_metrics_consistency(s):
    """/metrics is one consistent snapshot while clients come and go: with
    no request active or queued, every sequence held is a cached prefix's.
    (A cancelled request used to be counted out before its sequence was: a
    reader between the two saw 0 active requests beside its sequence; a
    stress run found 96 such samples in 16,366 before the fix, none after.)"""
    stop = threading.Event()
    bad, samples = [], [0]

    def poll():
        while not stop.is_set():
            m = s.metrics()
            samples[0] += 1
            if (m["dsqwen_active_requests"] == 0 and m["dsqwen_queue_length"] == 0 and
                    m["dsqwen_sequences"] != m["dsqwen_prefix_cache_entries"]):
                bad.append(m)

    th = threading.Thread(target=poll)
    th.start()
    n = 0
    try:
        t_end = time.time() + 4 * SLOW
        while time.time() < t_end:
            sock = socket.create_connection(("127.0.0.1", s.port))
            body = json.dumps(chat_body(f"stress {n}", max_tokens=400, stream=True))
            sock.sendall((f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                          f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                          + body).encode())
            got = b""
            while got.count(b"data: ") < 1 + n % 3:  # drop it after 1-3 chunks
                chunk = sock.recv(4096)
                if not chunk:
                    break
                got += chunk
            sock.close()
            n += 1
            # let the scheduler notice before the next one, sometimes not
            if n % 2:
                wait_for(lambda: s.metrics()["dsqwen_active_requests"] == 0, "the dropped request to leave")
    finally:
        stop.set()
        th.join()
    wait_for(lambda: s.metrics()["dsqwen_active_requests"] == 0, "the last dropped request to leave")
    check(not bad, f"{len(bad)} of {samples[0]} /metrics samples: no request active or queued, "
          "yet more sequences than cached prefixes", *bad[:1])
    print(f"  metrics consistency: {n} streams dropped, {samples[0]} samples", flush=True)


def test_slow_client(s):
    """A client that never reads its stream does not hold up the others:
    the scheduler only appends to the request's buffer."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", s.port))
    body = json.dumps(chat_body("a long reply nobody reads", max_tokens=300, stream=True,
                                logprobs=True, top_logprobs=5))
    sock.sendall((f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n" + body).encode())
    wait_for(lambda: s.metrics()["dsqwen_active_requests"] == 1, "the slow request to start")
    t0 = time.time()
    for _ in range(3):
        st, _, js, text = s.post(CHAT, chat_body("quick", max_tokens=8))
        check(st == 200, "a request beside the slow client", text)
    # the unread reply runs to its end (300 tokens of SSE with top-5 logprobs,
    # ~200 kB) without the client reading a byte
    wait_for(lambda: s.metrics()["dsqwen_active_requests"] == 0, "the unread reply to finish", 60)
    print(f"  slow client: 3 replies beside it in {time.time() - t0:.2f} s", flush=True)
    sock.close()


def load_wave(s, n_clients, max_tokens):
    results = [None] * n_clients

    def client(i):
        try:
            b = {"prompt": f"Client {i} says " + "word " * (i % 7), "max_tokens": max_tokens,
                 "temperature": 0.8, "seed": i, "stream": True,
                 "stream_options": {"include_usage": True}}
            st, chunks, done = s.stream(CMPL, b)
            text_chunks = [c for c in chunks if c["choices"]]
            results[i] = (st, done, chunks[-1].get("usage") if chunks else None, len(text_chunks))
        except Exception as e:  # reported below
            results[i] = ("exception", repr(e))

    ts = [threading.Thread(target=client, args=(i,)) for i in range(n_clients)]
    t0 = time.time()
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=300 * SLOW)
    check(all(not t.is_alive() for t in ts), "a load client hung")
    for i, r in enumerate(results):
        check(r and r[0] == 200 and r[1] and r[2] and 1 <= r[2]["completion_tokens"] <= max_tokens,
              f"load client {i} did not complete", r)
    return time.time() - t0, sum(r[2]["completion_tokens"] for r in results)


def test_load(s):
    """32 concurrent streaming clients, twice; every reply completes and the
    server's RSS does not grow from the first wave to the second."""
    m0 = s.metrics()
    dt1, n1 = load_wave(s, 32, 24)
    rss1 = s.rss_kb()
    dt2, n2 = load_wave(s, 32, 24)
    rss2 = s.rss_kb()
    m = s.metrics()
    print(f"  load: wave 1 {n1} tokens in {dt1:.2f} s, wave 2 {n2} tokens in {dt2:.2f} s; "
          f"RSS {rss1} -> {rss2} kB", flush=True)
    batched = m["dsqwen_batch_size_steps_count"] - m['dsqwen_batch_size_steps_bucket{le="1"}'] - \
        (m0["dsqwen_batch_size_steps_count"] - m0['dsqwen_batch_size_steps_bucket{le="1"}'])
    check(batched > 0, "steps batched several requests", m)
    check(m["dsqwen_mixed_steps_total"] > m0["dsqwen_mixed_steps_total"],
          "prompts were admitted in steps beside running decodes", m)
    check(m["dsqwen_active_requests"] == 0 and m["dsqwen_queue_length"] == 0, "all done", m)
    steps = m["dsqwen_steps_total"] - m0["dsqwen_steps_total"]
    for h in ("dsqwen_step_seconds", "dsqwen_host_seconds"):
        check(m[h + "_count"] - m0[h + "_count"] == steps, f"{h} observed once per step", m)
        check(m[h + '_bucket{le="+Inf"}'] == m[h + "_count"], f"{h} buckets are cumulative", m)
    step_s = m["dsqwen_step_seconds_sum"] - m0["dsqwen_step_seconds_sum"]
    host_s = m["dsqwen_host_seconds_sum"] - m0["dsqwen_host_seconds_sum"]
    check(step_s > 0 and host_s >= 0 and step_s + host_s <= dt1 + dt2 + 1.0,
          f"step {step_s:.3f} s + host {host_s:.3f} s within the waves' {dt1 + dt2:.2f} s", m)
    print(f"  load: {steps:.0f} steps, {1e3 * step_s / steps:.2f} ms in dsq_step and "
          f"{1e3 * host_s / steps:.3f} ms of scheduler work per step", flush=True)
    if not ASAN:  # ASan's quarantine holds freed memory on purpose
        check(rss2 - rss1 < 16 * 1024, f"RSS grew {rss2 - rss1} kB in the second wave")
    else:
        print("  load: RSS comparison not made under ASan (quarantine)", flush=True)


def test_pool_full_429(tiny):
    """A pool that holds one request: a second one is refused with 429 and
    Retry-After while the first runs (--max-queue 0), and admitted after the
    first one is cancelled."""
    sock = socket.create_connection(("127.0.0.1", tiny.port))
    body = json.dumps({"prompt": "hold the pool", "max_tokens": 200, "stream": True})
    sock.sendall((f"POST {CMPL} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
                  + body).encode())
    got = b""
    while b"data: " not in got:
        chunk = sock.recv(4096)
        check(chunk, "first stream ended early", got)
        got += chunk
    st, h, js, text = tiny.post(CMPL, {"prompt": "me too", "max_tokens": 100})
    check(st == 429, "second request while the pool is full", st, text)
    check(int(h.get("Retry-After", "0")) >= 1, "Retry-After header", h)
    check(err_field(js)["type"] == "rate_limit_error", "429 error object", js)
    sock.close()
    wait_for(lambda: tiny.metrics()["dsqwen_active_requests"] == 0, "the first to be cancelled")
    st, h, js, text = tiny.post(CMPL, {"prompt": "me too", "max_tokens": 10})
    check(st == 200, "admitted once the pool has room", st, text)
    check(tiny.metrics()['dsqwen_requests_total{outcome="rejected"}'] >= 1, "429 counted")


def test_reasoning_inline(tiny):
    """--reasoning-inline: the thought stays in content, <think> included."""
    st, _, js, text = tiny.post(CHAT, chat_body("hi", max_tokens=4))
    check(st == 200, "chat on the inline server", text)
    m = js["choices"][0]["message"]
    check(m["content"].startswith("<think>\n") and "reasoning_content" not in m,
          "inline reasoning", m)
    st, chunks, done = tiny.stream(CHAT, chat_body("hi", max_tokens=4, stream=True))
    content, reasoning, _ = collect_chat_stream(chunks)
    check(done and content.startswith("<think>\n") and reasoning == "", "inline stream",
          chunks)


def test_shutdown_midstream(tiny):
    """SIGINT while a reply streams: the stream ends ([DONE]) and the server
    exits 0 (under ASan: with no leak)."""
    c = http.client.HTTPConnection("127.0.0.1", tiny.port, timeout=60 * SLOW)
    c.request("POST", CMPL, body=json.dumps({"prompt": "long", "max_tokens": 200,
                                             "stream": True}))
    r = c.getresponse()
    first = r.readline()
    check(first.startswith(b"data: "), "stream started", first)
    rc = tiny.stop(signal.SIGINT)
    rest = r.read()
    check(rest.rstrip().endswith(b"data: [DONE]"), "stream closed with [DONE]", rest[-300:])
    check(rc == 0, f"server exit status {rc} after SIGINT", "".join(tiny.err_lines[-30:]))


def run_http():
    main = Server("--ctx", "2048", "--max-seqs", "8", "--batch-tokens", "256",
                  "--prefill-chunk", "32", "--prefix-min", "16", "--max-body", "65536")
    ref = Server("--ctx", "2048", "--max-seqs", "2", "--prefix-cache", "0", "--no-overlap", key=None)
    tiny = Server("--ctx", "256", "--max-seqs", "2", "--kv-pool-tokens", "256",
                  "--max-queue", "0", "--retry-after", "2", "--reasoning-inline", key=None)
    tests = [("basics", lambda: test_basics(main)), ("auth", lambda: test_auth(main)),
             ("keepalive", lambda: test_keepalive(main)),
             ("chat_nonstream", lambda: test_chat_nonstream(main)),
             ("chat_stream", lambda: test_chat_stream(main)),
             ("completions", lambda: test_completions(main)),
             ("stop_strings", lambda: test_stop_strings(main)),
             ("logprobs", lambda: test_logprobs(main)), ("seed", lambda: test_seed(main)),
             ("overlap_equal", lambda: test_overlap_equal(main, ref)),
             ("malformed", lambda: test_malformed(main)),
             ("prefix_cache", lambda: test_prefix_cache(main, ref)),
             ("prefix_eviction", test_prefix_eviction),
             ("prefix_pool_deadlock", test_prefix_pool_deadlock),
             ("cancellation", lambda: test_cancellation(main)),
             ("metrics_consistency", lambda: test_metrics_consistency(main)),
             ("slow_client", lambda: test_slow_client(main)),
             ("pool_full_429", lambda: test_pool_full_429(tiny)),
             ("reasoning_inline", lambda: test_reasoning_inline(tiny)),
             ("load_32_clients", lambda: test_load(main)),
             ("shutdown_midstream", lambda: test_shutdown_midstream(tiny))]
    failed = 0
    try:
        for name, fn in tests:
            t0 = time.time()
            try:
                fn()
                print(f"PASS {name} ({time.time() - t0:.1f} s)", flush=True)
            except Exception as e:
                failed += 1
                print(f"FAIL {name}: {e}", flush=True)
        for srv, name in ((main, "main"), (ref, "ref")):
            rc = srv.stop()
            if rc != 0:
                failed += 1
                print(f"FAIL shutdown of the {name} server: exit {rc}\n" +
                      "".join(srv.err_lines[-40:]), flush=True)
            else:
                print(f"PASS shutdown ({name} server, SIGTERM, exit 0)", flush=True)
    finally:
        for srv in (main, ref, tiny):
            srv.kill()
    return failed


# ---- the openai part ------------------------------------------------------------

def ensure_openai():
    """Import openai, from VENV (installed there from PyPI if needed); on
    failure print SKIPPED and exit 77."""
    try:
        import openai  # noqa: F401
        return
    except ImportError:
        pass
    if not VENV or "--in-venv" in sys.argv:
        print("SKIPPED: the openai package is not importable", flush=True)
        sys.exit(77)
    py = os.path.join(VENV, "bin", "python")
    ok = os.path.exists(py) and subprocess.run([py, "-c", "import openai"],
                                               capture_output=True).returncode == 0
    if not ok:
        if not os.path.exists(py):
            r = subprocess.run([sys.executable, "-m", "venv", VENV], capture_output=True, text=True)
            if r.returncode != 0:
                print("SKIPPED: openai client tests: cannot make a venv: " + r.stderr[-500:],
                      flush=True)
                sys.exit(77)
        try:
            r = subprocess.run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                                "--timeout", "20", "--retries", "1", "openai"], capture_output=True, text=True,
                               timeout=300)
            err = r.stderr
        except subprocess.TimeoutExpired:
            r, err = None, "pip timed out"
        if r is None or r.returncode != 0:
            print("SKIPPED: openai client tests: `pip install openai` failed (PyPI unreachable?): "
                  + err[-800:], flush=True)
            sys.exit(77)
    os.execv(py, [py] + sys.argv + ["--in-venv"])


def run_openai():
    ensure_openai()
    import openai
    print(f"  openai {openai.__version__}", flush=True)
    s = Server("--ctx", "1024", "--max-seqs", "4")
    failed = 0
    client = openai.OpenAI(base_url=s.base + "/v1", api_key=KEY, max_retries=0)

    def t_models():
        ids = [m.id for m in client.models.list()]
        check(ids == ["demo-model"], "models.list", ids)

    def t_chat():
        r = client.chat.completions.create(model="demo-model", max_tokens=8, temperature=0,
                                           messages=[{"role": "user", "content": "Hello!"}])
        check(r.choices[0].message.role == "assistant", "role", r)
        check(r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 0, "usage", r)
        reasoning = getattr(r.choices[0].message, "reasoning_content", None)
        check(reasoning is not None, "reasoning_content reaches the client", r)
        return r

    def t_chat_stream():
        ref = client.chat.completions.create(model="demo-model", max_tokens=8, temperature=0,
                                             messages=[{"role": "user", "content": "Hello!"}])
        st = client.chat.completions.create(model="demo-model", max_tokens=8, temperature=0,
                                            messages=[{"role": "user", "content": "Hello!"}],
                                            stream=True, stream_options={"include_usage": True})
        content = reasoning = ""
        usage = None
        for chunk in st:
            if chunk.usage:
                usage = chunk.usage
            for ch in chunk.choices:
                content += ch.delta.content or ""
                reasoning += getattr(ch.delta, "reasoning_content", None) or ""
        check(content == ref.choices[0].message.content, "streamed content", content, ref)
        check(reasoning == ref.choices[0].message.reasoning_content, "streamed reasoning",
              reasoning, ref)
        check(usage and usage.completion_tokens == ref.usage.completion_tokens, "stream usage",
              usage)

    def t_completions():
        r = client.completions.create(model="demo-model", prompt="Once upon", max_tokens=6,
                                      temperature=0, logprobs=2)
        check(len(r.choices[0].logprobs.tokens) == r.usage.completion_tokens, "logprobs", r)
        st = client.completions.create(model="demo-model", prompt="Once upon", max_tokens=6,
                                       temperature=0, stream=True)
        text = "".join(c.choices[0].text for c in st if c.choices)
        check(text == r.choices[0].text, "streamed completion", text, r)

    def t_errors():
        try:
            client.chat.completions.create(model="demo-model", n=2,
                                           messages=[{"role": "user", "content": "x"}])
            check(False, "n=2 accepted")
        except openai.BadRequestError as e:
            check(e.status_code == 400 and "n" in str(e), "BadRequestError for n=2", e)
        bad = openai.OpenAI(base_url=s.base + "/v1", api_key="wrong", max_retries=0)
        try:
            bad.models.list()
            check(False, "wrong key accepted")
        except openai.AuthenticationError:
            pass

    try:
        for name, fn in (("openai_models", t_models), ("openai_chat", t_chat),
                         ("openai_chat_stream", t_chat_stream),
                         ("openai_completions", t_completions), ("openai_errors", t_errors)):
            try:
                fn()
                print(f"PASS {name}", flush=True)
            except Exception as e:
                failed += 1
                print(f"FAIL {name}: {e!r}", flush=True)
        rc = s.stop()
        if rc != 0:
            failed += 1
            print(f"FAIL shutdown: exit {rc}\n" + "".join(s.err_lines[-40:]), flush=True)
    finally:
        s.kill()
    return failed


def main():
    v = subprocess.run([DSQWEN, "--version"], capture_output=True, text=True)
    if "serve: yes" not in v.stdout:
        print("SKIPPED: this dsqwen was built without `serve` (libmicrohttpd-dev missing)",
              flush=True)
        return 77
    if PART == "http":
        from shutil import which
        if not which("curl"):
            print("FAIL: curl is not installed (scripts/deps.sh installs it)", flush=True)
            return 1
        failed = run_http()
    else:
        failed = run_openai()
    print(f"{'FAILED' if failed else 'OK'}: {failed} failure(s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
