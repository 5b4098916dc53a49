"""Context.step / fork / truncate and library-side sampling in generate, on
the tiny reference model (CPU backend, F32 KV: the exact reference mode).
Reference values: Hugging Face transformers logits from golden.json; the
log-probabilities are their log_softmax computed here."""
import math

import pytest

from conftest import TINY


def argmax(row):
    return max(range(len(row)), key=row.__getitem__)


def log_softmax(row):
    m = max(row)
    lse = m + math.log(sum(math.exp(x - m) for x in row))
    return [x - lse for x in row]


@pytest.fixture
def ctx(model, dsqwen):
    if not dsqwen.has_step():
        pytest.fail("the packaged library has no dsq_step")
    with model.context(max_seqs=3, max_context=256, kv_dtype=dsqwen.KvDtype.F32) as c:
        yield c


def test_greedy_step_matches_the_reference(ctx, golden, dsqwen):
    V, prompt = golden["vocab"], golden["prompt"]
    ref = golden["prefill"][(len(prompt) - 1) * V:len(prompt) * V]
    want_lp = log_softmax(ref)
    greedy = ctx.model.sample_params(temperature=0)
    r, = ctx.step([{"seq": 0, "tokens": prompt, "sample": greedy, "top_n": 5, "logprob": True,
                    "logits": True}])
    assert r.token == argmax(ref)
    assert abs(r.logprob - want_lp[r.token]) < 1e-3
    order = sorted(range(V), key=lambda i: -ref[i])[:5]
    assert [i for i, _ in r.top] == order
    assert all(abs(lp - want_lp[i]) < 1e-3 for i, lp in r.top)
    scale = max(abs(x) for x in ref)
    assert len(r.logits) == V and max(abs(a - b) for a, b in zip(r.logits, ref)) <= 1e-4 * scale
    # an entry that samples nothing reports nothing
    r, = ctx.step([(0, [r.token])])
    assert r == dsqwen.StepResult(None, None, [], None)
    assert ctx.seq_length(0) == len(prompt) + 1


def test_mixed_batch_equals_separate_calls(ctx, golden):
    prompt, dec = golden["prompt"], golden["decode_tokens"]
    V = golden["vocab"]
    ctx.prefill(prompt, seq=0, logits=None)
    a, b = ctx.step([{"seq": 0, "tokens": dec[:1], "logits": True},
                     {"seq": 1, "tokens": prompt, "logits": True}])
    ref_dec = golden["decode"][:V]
    ref_pre = golden["prefill"][(len(prompt) - 1) * V:len(prompt) * V]
    scale = max(abs(x) for x in ref_pre)
    assert max(abs(x - y) for x, y in zip(a.logits, ref_dec)) <= 1e-4 * scale
    assert max(abs(x - y) for x, y in zip(b.logits, ref_pre)) <= 1e-4 * scale


def test_fork_and_truncate(ctx, golden):
    prompt, dec = golden["prompt"], golden["decode_tokens"]
    V = golden["vocab"]
    ref = golden["decode"][:V]
    scale = max(abs(x) for x in ref)
    ctx.prefill(prompt, seq=0, logits=None)
    ctx.fork(0, 2)
    assert ctx.seq_length(2) == len(prompt)
    rows = ctx.decode_step([0, 2], [dec[0], dec[0]])
    for r in range(2):
        assert max(abs(x - y) for x, y in zip(rows[r * V:(r + 1) * V], ref)) <= 1e-4 * scale
    # back to the prompt, and the same step again gives the same logits
    ctx.truncate(0, len(prompt))
    assert ctx.seq_length(0) == len(prompt) and ctx.seq_length(2) == len(prompt) + 1
    row = ctx.decode_step([0], [dec[0]])
    assert max(abs(x - y) for x, y in zip(row, ref)) <= 1e-4 * scale


def test_step_errors(ctx, dsqwen):
    with pytest.raises(dsqwen.DsqError) as e:
        ctx.step([{"seq": 0, "tokens": [1, 2], "top_n": 3}])  # top_n without sample
    assert e.value.status == dsqwen.Status.ERR_INVALID_ARG
    assert ctx.seq_length(0) == 0  # nothing changed
    with pytest.raises(dsqwen.DsqError) as e:
        ctx.fork(0, 1)  # src empty
    assert e.value.status == dsqwen.Status.ERR_SEQ
    with pytest.raises(TypeError):
        ctx.step([{"seq": 0, "tokens": [1], "nope": 1}])
    with pytest.raises(TypeError):
        ctx.model.sample_params(no_such_field=1)


def test_synchronize_and_stream_on_the_cpu(ctx):
    ctx.synchronize()  # calls on the CPU backend are synchronous: returns at once
    assert ctx.cuda_stream is None


def test_generate_samples_in_the_library(model, golden, dsqwen):
    prompt = golden["prompt"]
    lib = list(model.generate_ids(prompt, max_tokens=8, temperature=0))
    host = list(model.generate_ids(prompt, max_tokens=8, temperature=0, library_sampling=False))
    assert lib == host and len(lib) == 8
    a = list(model.generate_ids(prompt, max_tokens=8, temperature=0.9, seed=11))
    b = list(model.generate_ids(prompt, max_tokens=8, temperature=0.9, seed=11))
    assert a == b
    # the same draws, step by step through Context.step
    sp = model.sample_params(temperature=0.9, seed=11)
    with model.context(max_context=128) as c:
        got, r = [], c.step([(0, prompt, sp)])[0]
        for _ in range(8):
            got.append(r.token)
            r = c.step([(0, [r.token], sp)])[0]
    assert got == a
    # penalties only the library sampler has
    list(model.generate_ids(prompt, max_tokens=4, presence_penalty=0.5, frequency_penalty=0.1))
