#!/usr/bin/env python3
"""generate.py - stream a model's continuation of a prompt through the dsqwen
ctypes bindings.

  generate.py MODEL_DIR "Why is the sky blue?"          chat-formatted prompt
  generate.py MODEL_DIR --raw "Once upon a time"        text as is (plus BOS)
  generate.py MODEL_DIR --tokens 151646,9707,1879       token ids in, text or ids out

Text prompts use the model's tokenizer.json (or --tokenizer PATH); a model
without one takes --tokens and prints ids.  --temperature 0 (default) is
greedy; --progress shows the load's progress.  Uses the installed `dsqwen` package (pip install .), else the
package sources in ../../python.  The library is --library PATH, else
$DSQWEN_LIBRARY, else the one inside the package, the install prefix's, or
the system loader's.  A summary line goes to stderr at the end.
"""
import argparse
import os
import sys
import time

try:
    import dsqwen  # the installed package (pip install .)
except ImportError:  # run from a source tree: the package's sources, library per DSQWEN_LIBRARY
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import dsqwen


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="model directory (config.json + safetensors)")
    ap.add_argument("prompt", nargs="?", help="prompt text")
    ap.add_argument("--tokens", help="prompt as token ids, comma or space separated")
    ap.add_argument("--raw", action="store_true", help="no chat format around the text")
    ap.add_argument("--system", help="system text for the chat format")
    ap.add_argument("--tokenizer", help="tokenizer.json to use instead of the model's")
    ap.add_argument("--backend", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0, help="<= 0: greedy")
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=0x5eed)
    ap.add_argument("--library", help="path of libdsqwen.so")
    ap.add_argument("--progress", action="store_true", help="show load progress on stderr")
    a = ap.parse_args()
    if (a.tokens is None) == (a.prompt is None):
        ap.error("give either a prompt or --tokens")
    return a


def prompt_ids(args, tok):
    if args.tokens is not None:
        return [int(t) for t in args.tokens.replace(",", " ").split()]
    if tok is None:
        raise SystemExit("error: this model has no tokenizer.json; use --tokens or --tokenizer")
    if args.raw:
        return tok.encode(args.prompt, add_special=True)
    msgs = ([(dsqwen.Role.SYSTEM, args.system)] if args.system else []) + \
        [(dsqwen.Role.USER, args.prompt)]
    return tok.encode(dsqwen.chat_format(msgs, add_generation_prompt=True))


def generate(args):
    backend = dsqwen.Backend[args.backend.upper()]
    shown = []

    def progress(fraction):  # called inside the load; returning False would cancel it
        pct = round(100 * fraction)
        if not shown or pct != shown[-1]:  # 1.0 may come more than once
            shown.append(pct)
            print("\rloading %3d%%" % pct, end="\n" if pct == 100 else "", file=sys.stderr,
                  flush=True)

    with dsqwen.Model(args.model, backend=backend,
                      progress=progress if args.progress else None) as model:
        own_tok = dsqwen.Tokenizer.load(args.tokenizer) if args.tokenizer else None
        tok = own_tok if own_tok is not None else model.tokenizer
        ids = prompt_ids(args, tok)
        info = model.info
        eos = tok.eos if tok is not None else info.eos_token
        # the cache needs room for the prompt and the reply, no more
        n_ctx = min(info.max_context, len(ids) + args.max_tokens)
        with model.context(max_seqs=1, max_context=n_ctx) as ctx, \
                dsqwen.Sampler(temperature=args.temperature, top_k=args.top_k,
                               top_p=args.top_p, seed=args.seed,
                               n_vocab_valid=len(tok) if tok is not None else 0) as sampler:
            stream = tok.stream(skip_special=True) if tok is not None else None
            sampler.accept(ids)
            t0 = time.perf_counter()
            logits = ctx.prefill(ids)  # [n_vocab] of the last prompt token
            t1 = time.perf_counter()
            out = []
            while len(out) < args.max_tokens:
                t = sampler.sample(logits)
                out.append(t)
                print(stream.push(t) if stream else t, end="" if stream else " ", flush=True)
                if t == eos or len(out) == args.max_tokens:
                    break
                logits = ctx.decode_step([0], [t])  # [1 * n_vocab]
            t2 = time.perf_counter()
            print(stream.flush() if stream else "", flush=True)
            if stream:
                stream.close()
        if own_tok is not None:
            own_tok.close()
    n_dec = max(len(out) - 1, 0)
    print("[%s backend, libdsqwen %s] prompt %d tokens in %.3f s; generated %d tokens: %s "
          "(%.1f tokens/s decode)" % (dsqwen.Backend(info.backend).name.lower(),
                                      dsqwen.version(), len(ids), t1 - t0, len(out),
                                      " ".join(map(str, out)),
                                      n_dec / (t2 - t1) if n_dec and t2 > t1 else 0.0),
          file=sys.stderr)


def main():
    args = parse_args()
    try:
        if args.library:
            dsqwen.load_library(args.library)
        generate(args)
    except (dsqwen.DsqError, OSError) as e:
        print("error:", e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
