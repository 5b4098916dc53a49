"""dsqwen._generate - the decode loops behind Model.generate / generate_ids / chat.

Each call makes its own single-sequence Context sized for prompt + max_tokens
and a Sampler from the model's recommended settings, and frees both when the
iterator ends, is closed, or is garbage-collected.  One Model may serve
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
    """Yield sampled ids forever (the caller stops); owns ctx and sampler."""
    if max_tokens <= 0:
        return
    n_ctx = min(model.info.max_context, len(ids) + max_tokens)
    if len(ids) >= n_ctx:
        raise ValueError("the prompt (%d tokens) leaves no room in the model's %d-token context"
                         % (len(ids), model.info.max_context))
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
