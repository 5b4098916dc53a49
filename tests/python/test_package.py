"""The installed `dsqwen` package on the tiny reference model (tests/data/tiny,
vocabulary 1000, no tokenizer of its own; the R1 tokenizer of tests/data/model
is loaded separately where text is needed: ids below 1000 are ordinary tokens
there).  Reference values come from Hugging Face transformers (golden.json)."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT, TINY


def argmax(row):
    return max(range(len(row)), key=row.__getitem__)


def test_library_is_the_packaged_copy(dsqwen):
    if os.environ.get("DSQWEN_LIBRARY"):
        pytest.skip("DSQWEN_LIBRARY overrides the packaged library")
    pkg = os.path.dirname(os.path.abspath(dsqwen.__file__))
    assert dsqwen.library_path() == os.path.join(pkg, "libdsqwen.so.0")
    assert dsqwen.version() == dsqwen.__version__


def test_prefill_and_decode_match_reference(dsqwen, model, golden):
    V, prompt, dec = golden["vocab"], golden["prompt"], golden["decode_tokens"]
    assert model.info.n_vocab == V and model.backend == dsqwen.Backend.CPU
    with model.context(max_context=256, kv_dtype=dsqwen.KvDtype.F32) as ctx:
        pre = ctx.prefill(prompt, logits="all")
        ref = golden["prefill"]
        scale = max(abs(x) for x in ref)
        assert max(abs(a - b) for a, b in zip(pre, ref)) <= 1e-4 * scale
        for i, t in enumerate(dec):
            row = ctx.decode_step([0], [t])
            want = golden["decode"][i * V:(i + 1) * V]
            assert argmax(row) == argmax(want)
            assert max(abs(a - b) for a, b in zip(row, want)) <= 1e-4 * scale
        assert ctx.seq_length(0) == len(prompt) + len(dec)


def test_numpy_logits(model, golden):
    np = pytest.importorskip("numpy")
    V, prompt = golden["vocab"], golden["prompt"]
    with model.context(max_context=256) as ctx:
        a = ctx.prefill(prompt, logits="all", numpy=True)
        assert isinstance(a, np.ndarray) and a.shape == (len(prompt), V) and a.dtype == np.float32
        ref = np.array(golden["prefill"], dtype=np.float32).reshape(len(prompt), V)
        assert int(a[-1].argmax()) == int(ref[-1].argmax())
        b = ctx.decode_step([0], [int(a[-1].argmax())], numpy=True)
        assert b.shape == (1, V)


def test_generate_ids_is_greedy_decode(model, golden):
    prompt = golden["prompt"]
    got = list(model.generate_ids(prompt, max_tokens=6, temperature=0))
    assert len(got) == 6
    # the first id is the reference's argmax; the rest, a hand-written greedy loop
    assert got[0] == argmax(golden["prefill"][-golden["vocab"]:])
    with model.context(max_context=256) as ctx:
        want, logits = [], ctx.prefill(prompt)
        for _ in range(6):
            want.append(argmax(logits))
            logits = ctx.decode_step([0], [want[-1]])
    assert got == want


def test_generate_streams_text(model, golden, tokenizer):
    ids = list(model.generate_ids(golden["prompt"], max_tokens=12, temperature=0))
    pieces = list(model.generate(golden["prompt"], max_tokens=12, temperature=0,
                                 tokenizer=tokenizer))
    assert all(isinstance(p, str) for p in pieces) and len(pieces) > 1
    assert "".join(pieces) == tokenizer.decode(ids, skip_special=True)


def test_generate_stop_string_is_not_shown(model, golden, tokenizer):
    full = "".join(model.generate(golden["prompt"], max_tokens=12, temperature=0,
                                  tokenizer=tokenizer))
    cut = len(full) // 2
    stop = full[cut:cut + 3]
    assert len(stop) == 3
    text = "".join(model.generate(golden["prompt"], max_tokens=12, temperature=0,
                                  tokenizer=tokenizer, stop=[stop]))
    assert text == full[:full.index(stop)]


def test_sampled_generation_is_reproducible(model, golden):
    a = list(model.generate_ids(golden["prompt"], max_tokens=8, temperature=0.9, seed=7))
    b = list(model.generate_ids(golden["prompt"], max_tokens=8, temperature=0.9, seed=7))
    assert a == b and all(0 <= t < golden["vocab"] for t in a)


def test_tokenize_detokenize(dsqwen, tokenizer):
    ids = tokenizer.encode("Hello, world! ünïcödé")
    assert tokenizer.decode(ids) == "Hello, world! ünïcödé"
    with dsqwen.Model(TINY, backend="cpu") as m:
        assert m.tokenizer is None
        with pytest.raises(ValueError, match="no tokenizer"):
            m.tokenize("hi")


def test_chat_formats_and_tokenizes(model, dsqwen, tokenizer):
    text = dsqwen.chat_format([(dsqwen.Role.USER, "Hi")])
    assert text.endswith("<｜Assistant｜><think>\n") and "<｜User｜>Hi" in text
    # the chat prompt holds special ids (151646...) that the tiny model's
    # 1000-word vocabulary refuses: the library's own error comes through
    with pytest.raises(dsqwen.DsqError) as e:
        list(model.chat([{"role": "user", "content": "Hi"}], tokenizer=tokenizer, max_tokens=2))
    assert e.value.status == dsqwen.Status.ERR_TOKEN and e.value.message


def test_errors_carry_status_and_message(dsqwen):
    with pytest.raises(dsqwen.DsqError) as e:
        dsqwen.Model("/no/such/model/dir")
    assert e.value.status == dsqwen.Status.ERR_IO and "/no/such/model/dir" in str(e.value)
    with pytest.raises(KeyError):
        dsqwen.Model(TINY, backend="tpu")
    with pytest.raises(TypeError):
        dsqwen.Model(TINY, no_such_field=1)


def test_cuda_request_without_gpu_is_no_device(dsqwen):
    try:
        with dsqwen.Model(TINY, backend="cuda") as m:
            assert m.backend == dsqwen.Backend.CUDA  # a GPU machine
    except dsqwen.DsqError as e:
        assert e.status == dsqwen.Status.ERR_NO_DEVICE
        assert "CUDA" in e.message


def test_missing_library_error_lists_where_it_looked(dsqwen, tmp_path):
    # a copy of the package without its library, and no system copy to find
    pkg = os.path.dirname(os.path.abspath(dsqwen.__file__))
    dst = tmp_path / "dsqwen"
    dst.mkdir()
    for f in os.listdir(pkg):
        if f.endswith(".py"):
            (dst / f).write_bytes(open(os.path.join(pkg, f), "rb").read())
    env = {k: v for k, v in os.environ.items() if k not in ("DSQWEN_LIBRARY", "LD_LIBRARY_PATH")}
    env["PYTHONPATH"] = str(tmp_path)
    code = "import dsqwen; dsqwen.version()"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       cwd=str(tmp_path))
    if r.returncode == 0:
        pytest.skip("a libdsqwen.so.0 is installed system-wide; the not-found path is not reachable")
    assert "libdsqwen not found" in r.stderr
    assert str(dst / "libdsqwen.so.0") in r.stderr          # inside the package
    assert os.path.join(sys.prefix, "lib", "libdsqwen.so.0") in r.stderr  # the prefix
    env["DSQWEN_LIBRARY"] = str(tmp_path / "nope.so")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       cwd=str(tmp_path))
    assert r.returncode != 0 and str(tmp_path / "nope.so") in r.stderr


# --------------------------------------------------------------------------
# Load options (dsq_model_params fields appended after 0.1.0) and features
# --------------------------------------------------------------------------


def test_progress_is_called_non_decreasing_up_to_one(dsqwen):
    seen = []
    with dsqwen.Model(TINY, backend="cpu", progress=seen.append) as m:
        assert m.info.n_vocab == 1000
    assert len(seen) >= 3  # parse, each of the 2 layers, ready
    assert all(0.0 <= f <= 1.0 for f in seen)
    assert all(a <= b for a, b in zip(seen, seen[1:])), seen
    assert seen[-1] == 1.0


def test_progress_returning_false_cancels_the_load(dsqwen):
    seen = []

    def stop_at_half(f):
        seen.append(f)
        return f < 0.5

    with pytest.raises(dsqwen.DsqError) as e:
        dsqwen.Model(TINY, backend="cpu", progress=stop_at_half)
    assert e.value.status == dsqwen.Status.ERR_CANCELLED and "cancel" in e.value.message
    assert seen[-1] >= 0.5 and all(f < 0.5 for f in seen[:-1])  # no call after the cancel
    # None (a callback without a return statement) continues
    with dsqwen.Model(TINY, backend="cpu", progress=lambda f: None):
        pass


def test_exception_in_progress_cancels_and_propagates(dsqwen):
    calls = []

    class Boom(Exception):
        pass

    def boom(f):
        calls.append(f)
        if f > 0:
            raise Boom("at %g" % f)

    with pytest.raises(Boom) as e:
        dsqwen.Model(TINY, backend="cpu", progress=boom)
    assert len([f for f in calls if f > 0]) == 1  # the load stopped at the raise
    cause = e.value.__cause__
    assert isinstance(cause, dsqwen.DsqError) and cause.status == dsqwen.Status.ERR_CANCELLED
    with pytest.raises(TypeError):
        dsqwen.Model(TINY, backend="cpu", progress=3)
    with pytest.raises(TypeError):
        dsqwen.Model(TINY, backend="cpu", progress_user=1)


def _tiny_copy(tmp_path):
    import shutil
    d = tmp_path / "tiny"
    d.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copyfile(os.path.join(TINY, f), str(d / f))
    return d


def _tensor_offset(path, name):
    """Absolute file offset of tensor `name`'s data in a safetensors file."""
    import json
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return 8 + n + header[name]["data_offsets"][0], header[name]["dtype"]


def test_skip_finite_check_loads_a_nan_weight(dsqwen, tmp_path):
    d = _tiny_copy(tmp_path)
    st = str(d / "model.safetensors")
    off, dtype = _tensor_offset(st, "model.layers.1.mlp.up_proj.weight")
    assert dtype == "BF16"
    with open(st, "r+b") as f:
        f.seek(off)
        f.write(b"\xc0\x7f")  # bf16 quiet NaN, little-endian
    with pytest.raises(dsqwen.DsqError) as e:
        dsqwen.Model(str(d), backend="cpu")
    assert e.value.status == dsqwen.Status.ERR_FORMAT and "up_proj" in e.value.message
    with dsqwen.Model(str(d), backend="cpu", skip_finite_check=True) as m:
        assert m.info.n_layers == 2


def test_copy_weights_survives_the_files_changing(dsqwen, tmp_path, golden):
    d = _tiny_copy(tmp_path)
    st = str(d / "model.safetensors")
    size = os.path.getsize(st)
    with dsqwen.Model(str(d), backend="cpu", copy_weights=True) as m:
        with open(st, "r+b") as f:  # overwrite in place (same inode): the
            f.write(b"\0" * size)    # mapping would show these zeros
        with m.context(max_context=128, kv_dtype=dsqwen.KvDtype.F32) as ctx:
            pre = ctx.prefill(golden["prompt"], logits="all")
    ref = golden["prefill"]
    scale = max(abs(x) for x in ref)
    assert max(abs(a - b) for a, b in zip(pre, ref)) <= 1e-4 * scale


def test_build_features_and_backend_available(dsqwen):
    words = dsqwen.build_features().split()
    assert "cpu" in words
    assert dsqwen.backend_available("cpu") is True
    assert dsqwen.backend_available(dsqwen.Backend.AUTO) is True
    if "cuda" not in words:
        assert dsqwen.backend_available("cuda") is False
    assert dsqwen.backend_available(99) is False


def test_quantize_at_load_and_save(dsqwen, tmp_path):
    # Model(quantize=..., quantize_head=...) and Model.save: the saved
    # checkpoint decodes bit for bit as the quantization done at load
    src = os.path.join(ROOT, "tests", "data", "quant_tiny", "bf16")
    prompt = [5, 17, 300, 42, 7]
    with dsqwen.Model(src, backend="cpu", quantize="q4", quantize_head=True) as m:
        dense = dsqwen.Model(src, backend="cpu")
        assert m.info.weight_bytes < dense.info.weight_bytes
        dense.close()
        with m.context(max_context=64) as ctx:
            want = ctx.prefill(prompt, logits="all")
        m.save(str(tmp_path / "q4"))
    with dsqwen.Model(str(tmp_path / "q4"), backend="cpu") as q:
        with q.context(max_context=64) as ctx:
            assert list(ctx.prefill(prompt, logits="all")) == list(want)
    with pytest.raises(dsqwen.DsqError) as e:
        dsqwen.Model(str(tmp_path / "q4"), backend="cpu", quantize=dsqwen.Quantize.INT8)
    assert e.value.status == dsqwen.Status.ERR_UNSUPPORTED
