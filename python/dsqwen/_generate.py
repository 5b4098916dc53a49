"""dsqwen._generate - the decode loops behind Model.generate / generate_ids / chat.

Each call makes its own single-sequence Context sized for prompt + max_tokens
and draws the tokens with the model's recommended settings, inside the
library through dsq_step() when it has it (on the GPU with the CUDA backend:
only the sampled id comes back, not n_vocab logits), else with a host
Sampler; everything is freed when the iterator ends, is closed, or is
garbage-collected.  One Model may serve
several generators at once (each has its own context); one generator must
be consumed by one thread at a time."""
from . import _capi


def _prompt_ids(model, prompt, tokenizer):
    if isinstance(prompt, (str, bytes)):
        return model._tok(tokenizer).encode(prompt, add_special=True)
    ids = [int(t) for t in prompt]
    if not ids:
        raise ValueError("the prompt is empty")
    return ids


def _loop(model, ids, max_tokens, sampling):
    """Yield sampled ids until the context is full (the caller stops
    earlier); owns the context and the sampler."""
    if max_tokens <= 0:
        return
    n_ctx = min(model.info.max_context, len(ids) + max_tokens)
    if len(ids) >= n_ctx:
        raise ValueError("the prompt (%d tokens) leaves no room in the model's %d-token context"
                         % (len(ids), model.info.max_context))
    sampling = dict(sampling)
    in_library = sampling.pop("library_sampling", None)
    if in_library is None:
        in_library = _capi.has_step()
    if in_library:
        yield from _step_loop(model, ids, n_ctx, model.sample_params(**sampling))
        return
    p = model.sampler_params(**sampling)
    with model.context(max_seqs=1, max_context=n_ctx) as ctx, _capi.Sampler(p) as sampler:
        sampler.accept(ids)
        logits = ctx.prefill(ids, seq=0)
        pos = len(ids)
        while True:
            tok = sampler.sample(logits)
            yield tok
            pos += 1
            if pos >= n_ctx:
                return
            logits = ctx.decode_step([0], [tok])


def _step_loop(model, ids, n_ctx, sp):
    """_loop through dsq_step(): each call appends the last drawn id and
    draws the next one inside the library.  The C structs are made once
    and reused for every step."""
    L = _capi._L()
    C = _capi.C
    with model.context(max_seqs=1, max_context=n_ctx) as ctx:
        if len(ids) > 1:
            ctx.prefill(ids[:-1], logits=None)  # chunked by max_batch_tokens
        tok = (C.c_int32 * 1)(ids[-1])
        entry = _capi.StepSeq(seq=0, n_tokens=1, tokens=C.cast(tok, C.POINTER(C.c_int32)),
                              sample=C.pointer(sp))
        out = _capi.StepOut()
        pos = len(ids)
        while True:
            _capi._check(L.dsq_step(ctx.handle, C.byref(entry), 1, None, C.byref(out)), "dsq_step")
            if out.token < 0:
                raise RuntimeError("dsq_step drew no token: the logits hold no finite value")
            yield out.token
            pos += 1
            if pos >= n_ctx:
                return
            tok[0] = out.token


def id_stream(model, prompt_ids, max_tokens, stop_ids, sampling):
    ids = _prompt_ids(model, prompt_ids, None) if not isinstance(prompt_ids, (str, bytes)) \
        else model.tokenize(prompt_ids, add_special=True)
    if stop_ids is None:
        stop_ids = [model.tokenizer.eos] if model.tokenizer is not None and model.tokenizer.eos >= 0 \
            else []
    stop_ids = set(stop_ids)
    loop = _loop(model, ids, max_tokens, sampling)
    try:
        for i, tok in enumerate(loop):
            yield tok
            if tok in stop_ids or i + 1 >= max_tokens:
                return
    finally:
        loop.close()  # frees the context and sampler now, not at GC


def text_stream(model, prompt, max_tokens, stop, tokenizer, sampling):
    tok_obj = model._tok(tokenizer)
    ids = _prompt_ids(model, prompt, tokenizer)
    if isinstance(stop, str):
        stop = [stop]
    loop = _loop(model, ids, max_tokens, sampling)
    try:
        with _capi.Stopper(tok_obj, list(stop), stop_on_eos=True) as stopper:
            for i, tok in enumerate(loop):
                text, stopped = stopper.push(tok)
                if text:
                    yield text
                if stopped:
                    return
                if i + 1 >= max_tokens:
                    break
            rest = stopper.flush()
            if rest:
                yield rest
    finally:
        loop.close()
