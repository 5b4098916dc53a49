//! The safe API on the tiny reference model (tests/data/tiny: vocabulary
//! 1000, no tokenizer; the R1 tokenizer of tests/data/model is loaded
//! separately for text: ids below 1000 are ordinary tokens there).  The
//! reference values come from Hugging Face transformers (golden.json).
use dsqwen::{argmax, Backend, GenerateOptions, Model, Tokenizer};
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
