#!/usr/bin/env python3
"""The dsqwen CLI as a user meets it (standard library only): exit codes,
flag checks before the model loads, per-command help, chat that survives bad
lines and a full context, no stray <think> after an error, Ctrl-C, the
terminal hint and progress bar.

    python3 test_cli.py DSQWEN_BINARY TESTS_DATA_DIR DEMO_MODEL_DIR [TEST ...]

TESTS_DATA_DIR holds tiny/ (no tokenizer) and model/ (config + tokenizer,
no weights: loading it fails, so a check that happens only after a load
shows up as exit 1 instead of 2).  DEMO_MODEL_DIR is made by
scripts/make_demo_model.py (real tokenizer, random weights).
Exits 0 when every test passes, 1 otherwise.
"""
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

DSQWEN, DATA, DEMO = sys.argv[1], sys.argv[2], sys.argv[3]
TINY = os.path.join(DATA, "tiny")
NOWEIGHTS = os.path.join(DATA, "model")  # tokenizer + config, no safetensors


def run(args, stdin=b"", timeout=300):
    p = subprocess.run([DSQWEN] + args, input=stdin, capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def check(cond, what, *context):
    if not cond:
        raise AssertionError(what + "".join("\n--- " + str(c) for c in context))


def expect(args, rc, err_has=None, out_has=None, out_lacks=None, stdin=b""):
    got, out, err = run(args, stdin)
    check(got == rc, f"dsqwen {' '.join(args)}: exit {got}, expected {rc}", out, err)
    if err_has:
        check(err_has in err, f"stderr lacks {err_has!r}", err)
    if out_has:
        check(out_has in out, f"stdout lacks {out_has!r}", out)
    if out_lacks:
        check(out_lacks not in out, f"stdout has {out_lacks!r}", out)
    return out, err


# ---- usage errors: exit 2, found before the model loads ------------------------

def test_top_p_refused_before_load():
    # NOWEIGHTS cannot load: a check made after loading would give exit 1
    expect(["generate", "--model", NOWEIGHTS, "--top-p", "1.5", "hi"], 2, err_has="--top-p")
    expect(["chat", "--model", NOWEIGHTS, "--min-p", "2"], 2, err_has="--min-p")
    expect(["generate", "--model", NOWEIGHTS, "--repeat-penalty", "0", "hi"], 2,
           err_has="--repeat-penalty")


def test_bench_batch_names_bad_value():
    _, err = expect(["bench", "--model", TINY, "--batch", "1,x"], 2, err_has="'x'")
    check("--batch" in err, "message does not name --batch", err)
    expect(["bench", "--model", TINY, "--batch", "1,0"], 2, err_has="'0'")


def test_bench_rows():
    # every sampling mode prints one row per batch size; a prompt longer than
    # --batch-tokens goes partly through dsq_prefill, its last pass through
    # dsq_step (gpu mode), and every sequence gets --max-tokens steps
    for mode in ("gpu", "host", "none"):
        out, err = expect(["bench", "--model", TINY, "--backend", "cpu", "--prompt-len", "40",
                           "--batch-tokens", "16", "--max-tokens", "5", "--batch", "1,3",
                           "--sampling", mode], 0)
        rows = [l.split() for l in out.splitlines() if re.match(r"\s*\d+\s+40\s", l)]
        check([r[0] for r in rows] == ["1", "3"], f"bench --sampling {mode}: rows for batches 1, 3", out, err)
        for r in rows:
            check(len(r) == 10 and r[4] == "5" and all(float(x) > 0 for x in r[2:4] + r[5:7]),
                  f"bench --sampling {mode}: a row without positive timings", out)


def test_bench_bandwidth():
    # floor% is computed against --bandwidth (default the H200's 4,480 GB/s),
    # which the header names; only bench takes it, and only positive numbers
    for bad in ("0", "-3", "x"):
        expect(["bench", "--model", TINY, "--bandwidth", bad], 2, err_has="--bandwidth")
    expect(["generate", "--model", TINY, "--bandwidth", "3350"], 2, err_has="does not apply")
    args = ["bench", "--model", TINY, "--backend", "cpu", "--prompt-len", "8", "--max-tokens", "3"]
    _, err = expect(args, 0)
    check("floor% at 4480 GB/s" in err, "bench header without the default bandwidth", err)
    _, err = expect(args + ["--bandwidth", "3350"], 0)
    check("floor% at 3350 GB/s" in err, "bench header without --bandwidth's value", err)


def test_seed():
    expect(["generate", "--model", TINY, "--tokens", "1,2", "--seed", "-5"], 2, err_has="--seed")
    expect(["generate", "--model", TINY, "--tokens", "1,2", "--seed", "x"], 2, err_has="--seed")
    # -1 is documented as "a random seed": runs, and --verbose shows the seed
    _, err = expect(["generate", "--model", TINY, "--tokens", "1,2", "--max-tokens", "2",
                     "--seed", "-1", "--verbose", "--temperature", "1", "--backend", "cpu"], 0)
    seeds = [l for l in err.splitlines() if "seed " in l]
    check(seeds and "18446744073709551615" not in seeds[0], "no sane seed in --verbose", err)


def test_other_usage_errors():
    expect(["generate", "--model", TINY, "--bogus"], 2, err_has="--bogus")
    expect(["generate", "--model", TINY, "--seed"], 2, err_has="needs a value")
    expect(["bench", "--model", TINY, "--top-p", "0.5"], 2, err_has="does not apply")
    expect(["generate", "--model", TINY, "--tokens", "1,x"], 2, err_has="'x'")
    expect(["generate", "--model", TINY, "hello"], 2, err_has="tokenizer")
    expect(["generate", "--model", os.path.join(DATA, "does-not-exist"), "--tokens", "1"], 2)
    expect(["generate", "--tokens", "1"], 2, err_has="--model")
    expect(["frobnicate"], 2, err_has="unknown command")
    expect(["chat", "--model", TINY, "extra"], 2, err_has="unexpected argument")


def test_runtime_failure_is_1():
    expect(["generate", "--model", NOWEIGHTS, "hi"], 1, err_has="loading the model")


# ---- help and version ---------------------------------------------------------------

def test_per_command_help():
    out, _ = expect(["generate", "--help"], 0, out_has="usage: dsqwen generate")
    # --batch is bench's alone (--batch-tokens is every command's)
    check("--top-p" in out and not re.search(r"--batch(?![-\w])", out), "generate --help lists wrong options", out)
    out, _ = expect(["bench", "--help"], 0, out_has="usage: dsqwen bench")
    check(re.search(r"--batch(?![-\w])", out) and "--top-p" not in out, "bench --help lists wrong options", out)
    expect(["chat", "--help"], 0, out_has="usage: dsqwen chat")
    expect(["help", "chat"], 0, out_has="usage: dsqwen chat")
    expect(["--help"], 0, out_has="dsqwen COMMAND --help")


def test_version_says_what_is_built_in():
    out, _ = expect(["--version"], 0, out_has="CUDA backend: ")
    check("line editing: " in out, "--version lacks line editing", out)


def test_verbose():
    # --backend cpu: the expected text names the backend (AUTO picks CUDA on a GPU machine)
    _, err = expect(["generate", "--model", TINY, "--tokens", "1,2,3", "--max-tokens", "2",
                     "--verbose", "--backend", "cpu"], 0)
    for want in ("backend cpu", "loaded in", "2 layers", "vocab 1000", "KV f16"):
        check(want in err, f"--verbose lacks {want!r}", err)
    # the library's own log messages reach stderr: a model whose
    # tokenizer_config.json is broken loads with a warning
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        for f in ("config.json", "model.safetensors", "tokenizer.json"):
            os.symlink(os.path.join(os.path.abspath(DEMO), f), os.path.join(d, f))
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            f.write("{ not json")
        args = ["generate", "--model", d, "--backend", "cpu", "--max-tokens", "1", "hi"]
        _, err = expect(args + ["--verbose"], 0)
        check("libdsqwen warning: tokenizer_config.json" in err, "no library log message", err)
        _, err = expect(args, 0)
        check("libdsqwen" not in err, "library messages without --verbose", err)


# ---- generate -------------------------------------------------------------------------

def test_no_stray_think_after_error():
    prompt = "a prompt that is far longer than the eight tokens of this context " * 2
    out, err = expect(["generate", "--model", DEMO, "--backend", "cpu", "--ctx", "8", prompt], 1,
                      err_has="does not fit")
    check("<think>" not in out, "stray <think> printed after the error", out)


def test_generate_ok():
    out, _ = expect(["generate", "--model", DEMO, "--backend", "cpu", "--max-tokens", "3",
                     "--seed", "1", "hello"], 0)
    check(out.startswith("<think>"), "reply does not open the thought", out)


# ---- quantize -----------------------------------------------------------------------------

QSRC = os.path.join(DATA, "quant_tiny", "bf16")


def test_quantize_roundtrip():
    # the written checkpoint loads as it is and decodes exactly as the same
    # quantization done at load (test_quant_load checks the logits bit for bit)
    import json
    import shutil
    import tempfile
    tmp = tempfile.mkdtemp()
    try:
        for bits, q, head in (("4", "q4", True), ("8", "int8", False)):
            out = os.path.join(tmp, "q" + bits)
            _, err = expect(["quantize", QSRC, out, "--bits", bits] + (["--head"] if head else []), 0,
                            err_has="wrote " + out)
            qc = json.load(open(os.path.join(out, "config.json")))["quantization_config"]
            check(qc["quant_method"] == "dsqwen" and qc["bits"] == int(bits), "quantization_config", qc)
            gen = ["generate", "--backend", "cpu", "--tokens", "5,17,300", "--greedy", "--max-tokens", "12"]
            a, _ = expect(gen + ["--model", out], 0)
            b, _ = expect(gen + ["--model", QSRC, "--quantize", q] + (["--quantize-head"] if head else []), 0)
            check(a == b and a.strip(), "written checkpoint decodes differently", a, b)
        # a quantized checkpoint is not quantized again (runtime failure: 1)
        expect(["quantize", os.path.join(tmp, "q4"), os.path.join(tmp, "again"), "--bits", "8"], 1,
               err_has="already quantized")
        # ... but one with only its head quantized has dense layers to quantize
        hd, h4 = os.path.join(tmp, "head_only"), os.path.join(tmp, "head_only_q4")
        expect(["quantize", QSRC, hd, "--head"], 0, err_has="wrote " + hd)
        expect(["quantize", hd, h4, "--bits", "4"], 0, err_has="wrote " + h4)
        a, _ = expect(gen + ["--model", h4], 0)
        b, _ = expect(gen + ["--model", QSRC, "--quantize", "q4", "--quantize-head"], 0)
        check(a == b and a.strip(), "head-only checkpoint quantized again decodes differently", a, b)
        # --head alone: an AWQ checkpoint gets an int8 head, written as dsqwen 4-bit
        awq, out = os.path.join(os.path.dirname(QSRC), "awq"), os.path.join(tmp, "awq_h")
        expect(["quantize", awq, out, "--head"], 0, err_has="int8 head")
        qc = json.load(open(os.path.join(out, "config.json")))["quantization_config"]
        check(qc["quant_method"] == "dsqwen" and qc["bits"] == 4, "quantization_config", qc)
        gen = ["generate", "--backend", "cpu", "--tokens", "5,17,300", "--greedy", "--max-tokens", "12"]
        a, _ = expect(gen + ["--model", out], 0)
        b, _ = expect(gen + ["--model", awq, "--quantize-head"], 0)
        check(a == b and a.strip(), "AWQ + --quantize-head decodes unlike its written checkpoint", a, b)
    finally:
        shutil.rmtree(tmp)
    # usage errors: before anything loads
    expect(["quantize", QSRC, "/nonexistent/out"], 2, err_has="--bits")
    expect(["quantize", QSRC, "--bits", "3", "/tmp/x"], 2, err_has="--bits")
    expect(["quantize", QSRC, "--bits", "4"], 2, err_has="IN_DIR and OUT_DIR")
    expect(["quantize", "--model", QSRC, "a", "b", "--bits", "4"], 2, err_has="does not apply")
    expect(["generate", "--model", TINY, "--quantize", "q5", "--tokens", "1"], 2, err_has="--quantize")


# ---- chat -------------------------------------------------------------------------------

def replies(out):
    return [l for l in out.splitlines() if l.strip()]


def test_chat_survives_bad_lines():
    lines = b"1,2,3\n1,x\n999999\n4,5\n"
    out, err = expect(["chat", "--model", TINY, "--ctx", "64", "--max-tokens", "3"], 0,
                      stdin=lines)
    check("'x'" in err and "999999" in err, "bad lines not reported", err)
    check(len(replies(out)) == 2, "expected replies to both good lines", out, err)


def test_chat_full_context_drops_oldest_turns():
    lines = b"1,2,3,4,5,6,7,8,9,10\n11,12,13,14,15,16,17,18,19,20\n21,22,23,24,25,26\n"
    out, err = expect(["chat", "--model", TINY, "--ctx", "32", "--max-tokens", "6"], 0,
                      stdin=lines)
    check("dropped the oldest" in err, "no notice about dropped turns", err)
    check("new conversation" not in err, "old behaviour: conversation restarted", err)
    check(len(replies(out)) == 3, "every message must be answered", out, err)
    # a message longer than the whole context is refused; the chat goes on
    long_line = ",".join(str(i) for i in range(1, 41)).encode() + b"\n"
    out, err = expect(["chat", "--model", TINY, "--ctx", "32", "--max-tokens", "4"], 0,
                      stdin=b"1,2\n" + long_line + b"3,4\n")
    check("does not fit" in err and len(replies(out)) == 2, "long line not skipped", out, err)


def test_chat_text_with_template():
    out, err = expect(["chat", "--model", DEMO, "--backend", "cpu", "--ctx", "48",
                       "--max-tokens", "12", "--seed", "3"], 0,
                      stdin=b"first message\nsecond message\nthird message\n")
    check("dropped the oldest" in err, "demo chat did not drop turns at --ctx 48", err)
    check(err.count("tokens/s]") == 3 and out.count("<think>") >= 3,
          "each message must get a reply", out, err)


# ---- Ctrl-C -------------------------------------------------------------------------------

def read_until(fd, want, timeout):
    buf, end = b"", time.time() + timeout
    while want not in buf and time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buf += chunk
    return buf


def test_ctrl_c_stops_generate():
    p = subprocess.Popen([DSQWEN, "generate", "--model", TINY, "--tokens", "1,2,3", "--ctx", "4096",
                          "--max-tokens", "4000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = read_until(p.stdout.fileno(), b" ", 60)
    check(first, "no output before Ctrl-C")
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    err = err.decode(errors="replace")
    check(p.returncode == 130, f"exit {p.returncode} after Ctrl-C, expected 130", err)
    check("stopped by Ctrl-C" in err and "decode" in err, "no stop notice / stats", err)
    n = len((first + out).split())
    check(n < 3990, f"reply not stopped early ({n} tokens)")


def test_ctrl_c_in_chat():
    p = subprocess.Popen([DSQWEN, "chat", "--model", TINY, "--ctx", "4096", "--max-tokens", "4000"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = err = b""
    try:
        for k, line in enumerate((b"1,2,3\n", b"4,5\n")):
            p.stdin.write(line)
            p.stdin.flush()
            # wait for this reply's first tokens (earlier replies end in \n)
            while len(out.split(b"\n")[k].split()) < 2:
                chunk = read_until(p.stdout.fileno(), b" ", 60)
                check(chunk, "no reply output", out, err)
                out += chunk
            p.send_signal(signal.SIGINT)  # stops this reply, not the chat
            while err.count(b"reply stopped") < k + 1:
                chunk = read_until(p.stderr.fileno(), b"reply stopped", 30)
                check(chunk, "Ctrl-C did not stop the reply", out, err)
                err += chunk
            while out.count(b"\n") < k + 1:
                out += read_until(p.stdout.fileno(), b"\n", 30)
            check(p.poll() is None, "Ctrl-C during a reply ended the chat", err)
        p.send_signal(signal.SIGINT)  # at the prompt: leave
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    check(p.returncode == 130, f"chat exit {p.returncode} after Ctrl-C at the prompt, expected 130")
    n = [len(l.split()) for l in out.split(b"\n")[:2]]
    check(max(n) < 3990, f"replies not stopped early ({n} tokens)")


# ---- a terminal: hint, progress bar --------------------------------------------------------

def test_terminal_hint_and_progress_bar():
    master, slave = pty.openpty()
    p = subprocess.Popen([DSQWEN, "generate", "--model", DEMO, "--backend", "cpu",
                          "--max-tokens", "2"], stdin=slave, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    seen = read_until(master, b"Ctrl-D", 30)
    check(b"no prompt given" in seen, "no hint when waiting for a prompt on a terminal", seen)
    os.write(master, b"hello\n\x04")
    seen += read_until(master, b"tokens/s", 120)
    out = p.stdout.read()
    p.wait(timeout=60)
    os.close(master)
    check(p.returncode == 0, f"exit {p.returncode}", seen, out)
    check(b"loading the model [" in seen and b"100%" in seen, "no load progress bar", seen)


def test_chat_line_editing_history():
    _, vout, _ = run(["--version"])
    if "line editing: libedit" not in vout:
        print("     (built without libedit: only the plain-input path is tested)")
    master, slave = pty.openpty()
    p = subprocess.Popen([DSQWEN, "chat", "--model", TINY, "--max-tokens", "2", "--seed", "1",
                          "--temperature", "0"], stdin=slave, stdout=slave, stderr=slave,
                         # libedit forwards SIGINT with kill(0, ...): to its own
                         # process group only, not to this test
                         start_new_session=True)
    os.close(slave)
    try:
        seen = read_until(master, b"> ", 30)
        os.write(master, b"7,8,9\r")
        seen += read_until(master, b"tokens/s]\r\n> ", 60)
        if "line editing: libedit" in vout:
            os.write(master, b"\x1b[A\r")  # up arrow: the same message again
        else:
            os.write(master, b"7,8,9\r")
        seen += read_until(master, b"tokens/s]\r\n> ", 60)
        p.send_signal(signal.SIGINT)  # at the prompt: leave
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(master)
    text = seen.decode(errors="replace")
    check(text.count("prompt 3 tokens") == 1 and text.count("tokens/s") == 2,
          "the recalled line was not sent again", text)
    check(p.returncode == 130, f"exit {p.returncode}, expected 130", text)


TESTS = {k: v for k, v in globals().items() if k.startswith("test_")}


def main():
    names = sys.argv[4:] or list(TESTS)
    failed = 0
    for name in names:
        t0 = time.time()
        try:
            TESTS[name]()
            print(f"ok   {name} ({time.time() - t0:.1f} s)")
        except Exception as e:  # report every failure, then fail
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    print(f"{len(names) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
