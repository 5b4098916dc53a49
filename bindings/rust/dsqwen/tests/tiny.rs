//! The safe API on the tiny reference model (tests/data/tiny: vocabulary
//! 1000, no tokenizer; the R1 tokenizer of tests/data/model is loaded
//! separately for text: ids below 1000 are ordinary tokens there).  The
//! reference values come from Hugging Face transformers (golden.json).
use dsqwen::{argmax, Backend, GenerateOptions, Model, ModelParams, Quantize, Tokenizer};
use std::io::Write;
use std::path::PathBuf;

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../tests/data")
}

/// (prompt ids, reference argmax of the last prefill row) from golden.json
/// and prefill_logits.f32, parsed by hand (no crates).
fn golden() -> (Vec<i32>, usize) {
    let g = std::fs::read_to_string(data().join("tiny/golden.json")).unwrap();
    let field = |name: &str| -> String {
        let i = g.find(&format!("\"{name}\"")).unwrap();
        let rest = &g[i + name.len() + 2..];
        let rest = rest[rest.find(':').unwrap() + 1..].trim_start();
        let end = if rest.starts_with('[') { rest.find(']').unwrap() + 1 } else {
            rest.find([',', '}']).unwrap()
        };
        rest[..end].to_string()
    };
    let prompt: Vec<i32> = field("prompt").trim_matches(|c| c == '[' || c == ']').split(',')
        .map(|s| s.trim().parse().unwrap()).collect();
    let vocab: usize = field("vocab").trim().parse().unwrap();
    let raw = std::fs::read(data().join("tiny/prefill_logits.f32")).unwrap();
    let all: Vec<f32> = raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    assert_eq!(all.len(), prompt.len() * vocab);
    (prompt, argmax(&all[all.len() - vocab..]).unwrap())
}

#[test]
fn prefill_matches_the_reference_argmax() {
    let (prompt, want) = golden();
    let model = Model::load(data().join("tiny"), Backend::Cpu).unwrap();
    assert_eq!(model.backend(), Backend::Cpu);
    assert!(model.tokenizer().is_none());
    let mut p = Model::context_params();
    p.max_context = 256;
    let mut ctx = model.context(&p).unwrap();
    let logits = ctx.prefill(0, &prompt).unwrap();
    assert_eq!(logits.len(), 1000);
    assert_eq!(argmax(&logits), Some(want));
    assert_eq!(ctx.seq_length(0).unwrap(), prompt.len() as i32);
}

#[test]
fn generate_streams_the_greedy_text() {
    let (prompt, want) = golden();
    let model = Model::load(data().join("tiny"), Backend::Cpu).unwrap();
    let tok = Tokenizer::load(data().join("model/tokenizer.json")).unwrap();
    let opts = GenerateOptions { max_tokens: 10, temperature: Some(0.0), ..Default::default() };
    let pieces: Vec<String> = model.generate_tokens(&tok, &prompt, &opts).unwrap()
        .collect::<Result<_, _>>().unwrap();
    assert!(pieces.len() > 1);
    // the same greedy ids by hand
    let mut p = Model::context_params();
    p.max_context = 256;
    let mut ctx = model.context(&p).unwrap();
    let mut logits = ctx.prefill(0, &prompt).unwrap();
    let mut ids = Vec::new();
    for _ in 0..10 {
        ids.push(argmax(&logits).unwrap() as i32);
        logits = ctx.decode_step(&[0], &[*ids.last().unwrap()]).unwrap();
    }
    assert_eq!(ids[0] as usize, want);
    assert_eq!(pieces.concat(), tok.detokenize(&ids, true).unwrap());
    // a stop string is never shown and ends the stream
    let full = pieces.concat();
    let stop: String = full.chars().skip(full.chars().count() / 2).take(2).collect();
    let opts = GenerateOptions { stop: vec![stop.clone()], ..opts };
    let cut: String = model.generate_tokens(&tok, &prompt, &opts).unwrap()
        .collect::<Result<Vec<_>, _>>().unwrap().concat();
    assert_eq!(cut, full[..full.find(&stop).unwrap()]);
}

#[test]
fn errors_carry_status_and_message() {
    let e = Model::load("/nonexistent/model", Backend::Cpu).err().unwrap();
    assert_eq!(e.status, dsqwen::ffi::DSQ_ERR_IO);
    assert!(e.to_string().contains("DSQ_ERR_IO") && e.message.contains("/nonexistent/model"), "{e}");
    let model = Model::load(data().join("tiny"), Backend::Cpu).unwrap();
    let mut ctx = model.context(&Model::context_params()).unwrap();
    let e = ctx.prefill(0, &[5000]).err().unwrap();
    assert_eq!(e.status, dsqwen::ffi::DSQ_ERR_TOKEN);
    assert!(model.generate("hi", &GenerateOptions::default()).is_err()); // no tokenizer
}

#[test]
fn thread_rules_follow_the_header() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Model>();
    send_sync::<Tokenizer>();
    send::<dsqwen::Context<'static>>();
    send::<dsqwen::Sampler>();
    // a model shared by threads, each with its own context
    let (prompt, want) = golden();
    let model = Model::load(data().join("tiny"), Backend::Cpu).unwrap();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let mut p = Model::context_params();
                p.max_context = 128;
                let mut ctx = model.context(&p).unwrap();
                assert_eq!(argmax(&ctx.prefill(0, &prompt).unwrap()), Some(want));
            });
        }
    });
}

#[test]
fn progress_reports_non_decreasing_fractions_up_to_one() {
    let mut seen = Vec::new();
    let model = Model::load_with(data().join("tiny"),
                                 ModelParams::new().backend(Backend::Cpu)
                                     .progress(|f| { seen.push(f); true })).unwrap();
    assert_eq!(model.info().n_layers, 2);
    assert!(seen.len() >= 3, "{seen:?}");
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    assert!(seen.iter().all(|&f| (0.0..=1.0).contains(&f)), "{seen:?}");
    assert_eq!(*seen.last().unwrap(), 1.0);
}

#[test]
fn progress_returning_false_cancels() {
    let mut calls = 0;
    let e = Model::load_with(data().join("tiny"),
                             ModelParams::new().backend(Backend::Cpu)
                                 .progress(|f| { calls += 1; f < 0.5 })).err().unwrap();
    assert!(e.is_cancelled(), "{e}");
    assert_eq!(e.status, dsqwen::ffi::DSQ_ERR_CANCELLED);
    assert!(calls >= 2);
}

#[test]
fn panic_in_progress_cancels_and_resumes() {
    let mut after = 0;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Model::load_with(data().join("tiny"), ModelParams::new().backend(Backend::Cpu)
            .progress(|f| {
                if f > 0.0 {
                    after += 1;
                    panic!("stop at {f}");
                }
                true
            }))
    }));
    let payload = r.err().expect("the panic comes back out of load_with");
    assert!(payload.downcast_ref::<String>().unwrap().starts_with("stop at"));
    assert_eq!(after, 1); // not called again once cancelled
}

/// (offset in the file, dtype) of a tensor's data, from the safetensors
/// header read by hand (no crates).
fn tensor_offset(file: &[u8], name: &str) -> usize {
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let h = std::str::from_utf8(&file[8..8 + n]).unwrap();
    let at = h.find(&format!("\"{name}\"")).unwrap();
    let rest = &h[at..];
    assert!(rest[..rest.find('}').unwrap()].contains("\"BF16\""));
    let rest = &rest[rest.find("\"data_offsets\"").unwrap()..];
    let rest = &rest[rest.find('[').unwrap() + 1..];
    8 + n + rest[..rest.find(',').unwrap()].trim().parse::<usize>().unwrap()
}

#[test]
fn skip_finite_check_and_copy_weights_reach_the_library() {
    let dir = std::env::temp_dir().join(format!("dsqwen-rs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(data().join("tiny/config.json"), dir.join("config.json")).unwrap();
    let mut st = std::fs::read(data().join("tiny/model.safetensors")).unwrap();
    let off = tensor_offset(&st, "model.layers.1.mlp.up_proj.weight");
    st[off..off + 2].copy_from_slice(&[0xc0, 0x7f]); // bf16 NaN
    std::fs::write(dir.join("model.safetensors"), &st).unwrap();
    let e = Model::load(&dir, Backend::Cpu).err().unwrap();
    assert_eq!(e.status, dsqwen::ffi::DSQ_ERR_FORMAT);
    assert!(e.message.contains("up_proj"), "{e}");
    let m = Model::load_with(&dir, ModelParams::new().backend(Backend::Cpu).skip_finite_check(true)
                                       .copy_weights(true)).unwrap();
    // copied: zeroing the file in place (same inode) changes nothing now
    std::fs::OpenOptions::new().write(true).open(dir.join("model.safetensors")).unwrap()
        .write_all(&vec![0u8; st.len()]).unwrap();
    let (prompt, _) = golden();
    let mut p = Model::context_params();
    p.max_context = 128;
    let mut ctx = m.context(&p).unwrap();
    // the NaN weight makes every logit NaN; the zeros would make them all 0
    let logits = ctx.prefill(0, &prompt).unwrap();
    assert!(logits.iter().all(|x| x.is_nan()), "{:?}", &logits[..4]);
    drop(ctx);
    drop(m);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn features_and_backend_availability() {
    let words: Vec<&str> = dsqwen::build_features().split(' ').collect();
    assert!(words.contains(&"cpu"), "{words:?}");
    assert!(dsqwen::backend_available(Backend::Cpu) && dsqwen::backend_available(Backend::Auto));
    if !words.contains(&"cuda") {
        assert!(!dsqwen::backend_available(Backend::Cuda));
    }
}

#[test]
fn step_fork_truncate() {
    let (prompt, want) = golden();
    let model = Model::load(data().join("tiny"), Backend::Cpu).unwrap();
    let mut p = Model::context_params();
    p.max_context = 256;
    p.max_seqs = 2;
    let mut ctx = model.context(&p).unwrap();
    let mut greedy = dsqwen::ffi::dsq_sample_params::default();
    greedy.temperature = 0.0;
    let (tok, lp) = ctx.step_sample(0, &prompt, &greedy).unwrap().unwrap();
    assert_eq!(tok as usize, want);
    assert!(lp < 0.0 && lp.is_finite());
    // fork the prompt + first token; both copies continue alike
    ctx.fork(0, 1).unwrap();
    assert_eq!(ctx.seq_length(1).unwrap(), prompt.len() as i32);
    let rows = ctx.decode_step(&[0, 1], &[tok, tok]).unwrap();
    assert_eq!(rows[..1000], rows[1000..]);
    // back to the prompt: the same draw again
    ctx.truncate(0, prompt.len() as i32 - 1).unwrap();
    let again = ctx.step_sample(0, &prompt[prompt.len() - 1..], &greedy).unwrap().unwrap();
    assert_eq!(again.0, tok);
    assert!((again.1 - lp).abs() < 1e-5);
    let e = ctx.fork(0, 1).err().unwrap(); // dst active
    assert_eq!(e.status, dsqwen::ffi::DSQ_ERR_SEQ);
    // CPU backend: synchronous, no CUDA stream
    ctx.synchronize().unwrap();
    assert_eq!(ctx.cuda_stream().unwrap(), None);
}

#[test]
fn quantize_at_load_and_save_round_trip() {
    // tests/data/quant_tiny/bf16 quantized to 4 bits (int8 head) at load,
    // saved, and loaded again: the same logits, bit for bit
    let src = data().join("quant_tiny/bf16");
    let params = ModelParams::new().backend(Backend::Cpu).quantize(Quantize::Q4).quantize_head(true);
    let model = Model::load_with(&src, params).unwrap();
    let dense = Model::load(&src, Backend::Cpu).unwrap();
    assert!(model.info().weight_bytes < dense.info().weight_bytes);
    let out = std::env::temp_dir().join(format!("dsqwen_rust_q4_{}", std::process::id()));
    model.save(&out).unwrap();
    let prompt = [5, 17, 300, 42, 7];
    let mut p = Model::context_params();
    p.max_context = 64;
    let want = model.context(&p).unwrap().prefill(0, &prompt).unwrap();
    let saved = Model::load(&out, Backend::Cpu).unwrap();
    let got = saved.context(&p).unwrap().prefill(0, &prompt).unwrap();
    assert_eq!(got, want);
    let again = Model::load_with(&out, ModelParams::new().backend(Backend::Cpu).quantize(Quantize::Int8));
    assert!(again.is_err());
    std::fs::remove_dir_all(&out).unwrap();
}
