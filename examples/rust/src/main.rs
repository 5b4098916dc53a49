//! Greedy decoding through the Rust bindings: prefill the given token ids,
//! then feed back the argmax for a few steps and print the ids.
//!
//!     dsqwen-example MODEL_DIR [--backend auto|cpu|cuda] [--steps N] ID [ID...]
use dsqwen::{argmax, Backend, Model};
use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!("usage: dsqwen-example MODEL_DIR [--backend auto|cpu|cuda] [--steps N] ID [ID...]");
    ExitCode::from(2)
}

fn run(dir: &str, backend: Backend, steps: usize, prompt: &[i32]) -> dsqwen::Result<Vec<i32>> {
    let model = Model::load(dir, backend)?;
    let mut params = Model::context_params();
    params.max_context = (prompt.len() + steps) as i32;
    let mut ctx = model.context(&params)?;
    let mut logits = ctx.prefill(0, prompt)?;
    let mut out = Vec::with_capacity(steps);
    for step in 0..steps {
        let next = argmax(&logits).expect("n_vocab > 0") as i32;
        out.push(next);
        if step + 1 < steps {
            logits = ctx.decode_step(&[0], &[next])?;
        }
    }
    Ok(out)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut backend, mut steps, mut ids) = (Backend::Auto, 8usize, Vec::new());
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--backend" => {
                backend = match it.next().map(String::as_str) {
                    Some("auto") => Backend::Auto,
                    Some("cpu") => Backend::Cpu,
                    Some("cuda") => Backend::Cuda,
                    _ => return usage(),
                }
            }
            "--steps" => match it.next().and_then(|s| s.parse().ok()) {
                Some(n) => steps = n,
                None => return usage(),
            },
            _ => match a.parse::<i32>() {
                Ok(id) => ids.push(id),
                Err(_) => return usage(),
            },
        }
    }
    if args.is_empty() || ids.is_empty() {
        return usage();
    }
    match run(&args[0], backend, steps, &ids) {
        Ok(out) => {
            let out: Vec<String> = out.iter().map(i32::to_string).collect();
            println!("libdsqwen {}: prompt {} tokens; argmax ids: {}", dsqwen::version(),
                     ids.len(), out.join(" "));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("dsqwen-example: {e}");
            ExitCode::FAILURE
        }
    }
}
