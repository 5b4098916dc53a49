//! The safe Rust API of libdsqwen (the raw one is the `dsqwen-sys` crate,
//! re-exported as `ffi`).
//!
//! Every type owns one C handle and frees it on drop.  A `Context<'m>`
//! borrows its `Model` and a `Sampler`/`Stopper` its `Tokenizer` where the C
//! API needs the other to outlive it, so the compiler enforces the header's
//! lifetime rules.  Thread rules follow the header: `Model` and `Tokenizer`
//! are immutable and `Send + Sync`; `Context`, `Sampler` and `Stopper` are
//! used by one thread at a time, so they are `Send` but not `Sync`.  Every
//! failing call becomes an `Error` with the status and the library's
//! message for that call.
//!
//! ```no_run
//! use dsqwen::{Backend, Model, ModelParams};
//! let model = Model::load("path/to/model", Backend::Auto)?;
//! // or with load options and a progress report (return false to cancel):
//! let model = Model::load_with("path/to/model", ModelParams::new().backend(Backend::Cpu)
//!     .copy_weights(true).progress(|f| { eprint!("\r{:3.0}%", 100.0 * f); true }))?;
//! for piece in model.generate("Why is the sky blue?", &dsqwen::GenerateOptions::default())? {
//!     print!("{}", piece?);
//! }
//! # Ok::<(), dsqwen::Error>(())
//! ```
//!
//! A context cannot be shared between threads (it is not `Sync`):
//! ```compile_fail
//! fn needs_sync<T: Sync>() {}
//! needs_sync::<dsqwen::Context<'static>>();
//! ```
//! and a model cannot be dropped while a context borrows it:
//! ```compile_fail
//! let model = dsqwen::Model::load("m", dsqwen::Backend::Cpu).unwrap();
//! let ctx = model.context(&dsqwen::Model::context_params()).unwrap();
//! drop(model);
//! drop(ctx);
//! ```
pub use dsqwen_sys as ffi;

use std::any::Any;
use std::ffi::{CStr, CString};
use std::fmt;
use std::marker::PhantomData;
use std::os::raw::{c_int, c_void};
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::ptr::{self, NonNull};

/// A failed libdsqwen call: `status` is the (negative) dsq_status.
#[derive(Debug, Clone)]
pub struct Error {
    pub status: ffi::dsq_status,
    pub message: String,
}

impl Error {
    /// Capture this thread's last error message; must run right after the
    /// failing call (the message is valid only until the next one).
    fn last(status: ffi::dsq_status) -> Error {
        let message = unsafe { cstr(ffi::dsq_last_error_message()) };
        Error { status, message }
    }

    /// The load was cancelled by the progress callback (DSQ_ERR_CANCELLED).
    pub fn is_cancelled(&self) -> bool {
        self.status == ffi::DSQ_ERR_CANCELLED
    }

    /// dsq_status_string() of the status, e.g. "DSQ_ERR_IO: ...".
    pub fn status_string(&self) -> String {
        unsafe { cstr(ffi::dsq_status_string(self.status)) }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.status_string(), self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

fn check(status: ffi::dsq_status) -> Result<()> {
    if status == ffi::DSQ_OK { Ok(()) } else { Err(Error::last(status)) }
}

/// Owned copy of a library string (NULL reads as "").
unsafe fn cstr(p: *const std::os::raw::c_char) -> String {
    if p.is_null() { String::new() } else { CStr::from_ptr(p).to_string_lossy().into_owned() }
}

/// Version of the library actually loaded, e.g. "0.1.0".
pub fn version() -> String {
    unsafe { cstr(ffi::dsq_version_string()) }
}

/// What the library was built with (dsq_build_features()): space-separated
/// words, "cpu" always, "cuda" when the CUDA backend is compiled in.
pub fn build_features() -> &'static str {
    // SAFETY: a static NUL-terminated string that is never freed
    unsafe { CStr::from_ptr(ffi::dsq_build_features()) }.to_str().unwrap_or("")
}

/// Whether `backend` can be used on this machine now (dsq_backend_available);
/// Cuda: compiled in and a usable device found.
pub fn backend_available(backend: Backend) -> bool {
    unsafe { ffi::dsq_backend_available(backend as c_int) != 0 }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum Backend {
    Auto = ffi::DSQ_BACKEND_AUTO,
    Cpu = ffi::DSQ_BACKEND_CPU,
    Cuda = ffi::DSQ_BACKEND_CUDA,
}

/// Weight quantization at load (dsq_quantize; docs/quantization.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum Quantize {
    /// As the checkpoint stores them (bf16/f16/f32, or its AWQ/GPTQ/dsqwen format).
    None = ffi::DSQ_QUANTIZE_NONE,
    /// int8, one scale per output row.
    Int8 = ffi::DSQ_QUANTIZE_INT8,
    /// 4-bit, groups of 128 inputs with a scale and a zero point.
    Q4 = ffi::DSQ_QUANTIZE_Q4,
}

/// Settings of `Model::load_with` (dsq_model_params), built field by field
/// from the library's defaults.  `'p` is the lifetime of the progress
/// closure, which may borrow from the caller.
pub struct ModelParams<'p> {
    raw: ffi::dsq_model_params,
    progress: Option<Box<dyn FnMut(f32) -> bool + 'p>>,
}

impl Default for ModelParams<'_> {
    fn default() -> Self {
        ModelParams { raw: ffi::dsq_model_params::default(), progress: None }
    }
}

impl<'p> ModelParams<'p> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Where to run (default Backend::Auto).
    pub fn backend(mut self, backend: Backend) -> Self {
        self.raw.backend = backend as i32;
        self
    }

    /// CUDA device index (default 0).
    pub fn device(mut self, device: i32) -> Self {
        self.raw.device = device;
        self
    }

    /// Threads for the CPU backend's load-time weight scan (0: all cores).
    pub fn n_threads(mut self, n: i32) -> Self {
        self.raw.n_threads = n;
        self
    }

    /// Load tokenizer.json beside the weights if present (default true).
    pub fn load_tokenizer(mut self, yes: bool) -> Self {
        self.raw.load_tokenizer = yes as i32;
        self
    }

    /// Skip the check that every weight is finite (default false).
    pub fn skip_finite_check(mut self, yes: bool) -> Self {
        self.raw.skip_finite_check = yes as i32;
        self
    }

    /// CPU backend: copy the weights into private memory instead of
    /// computing from the mapped files, which may then change (default false).
    pub fn copy_weights(mut self, yes: bool) -> Self {
        self.raw.copy_weights = yes as i32;
        self
    }

    /// Quantize the linear weights at load (default Quantize::None); a
    /// checkpoint that is already quantized refuses anything but None.
    pub fn quantize(mut self, q: Quantize) -> Self {
        self.raw.quantize = q as i32;
        self
    }

    /// With `quantize`: the output head too, as int8 (default false).
    pub fn quantize_head(mut self, yes: bool) -> Self {
        self.raw.quantize_head = yes as i32;
        self
    }

    /// Called during the load, on the loading thread, with fractions in
    /// [0, 1] that never decrease, the last one 1.0.  Return false to cancel:
    /// the load then fails with an Error whose `is_cancelled()`.  A panic in
    /// the closure cancels the load and is resumed from `load_with`.
    pub fn progress(mut self, f: impl FnMut(f32) -> bool + 'p) -> Self {
        self.progress = Some(Box::new(f));
        self
    }

    /// The C struct as it stands (without the progress callback, which
    /// `load_with` installs for the duration of the load).
    pub fn raw(&self) -> &ffi::dsq_model_params {
        &self.raw
    }
}

/// What the C callback's user pointer points at during one load.
struct Progress<'a> {
    f: &'a mut dyn FnMut(f32) -> bool,
    panic: Option<Box<dyn Any + Send>>,
}

unsafe extern "C" fn progress_trampoline(fraction: f32, user: *mut c_void) -> c_int {
    // SAFETY: `user` is the &mut Progress that load_with passed, alive and
    // not otherwise used for the whole (synchronous) dsq_model_load call.
    let p = &mut *(user as *mut Progress<'_>);
    if p.panic.is_some() {
        return 1;
    }
    // a panic must not unwind into C: keep it, cancel, resume after the load
    match panic::catch_unwind(AssertUnwindSafe(|| (p.f)(fraction))) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(payload) => {
            p.panic = Some(payload);
            1
        }
    }
}

/// Loaded weights (dsq_model).  Immutable, so shareable across threads.
pub struct Model {
    raw: NonNull<ffi::dsq_model>,
    info: ffi::dsq_model_info,
}

fn invalid(message: impl Into<String>) -> Error {
    Error { status: ffi::DSQ_ERR_INVALID_ARG, message: message.into() }
}

fn c_path(path: &Path) -> Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes()).map_err(|_| invalid("path contains a NUL byte"))
}

// The header: a dsq_model is immutable after load and may be used by many
// threads and contexts at once.
unsafe impl Send for Model {}
unsafe impl Sync for Model {}

impl Model {
    /// Load a model directory (config.json + safetensors) or .safetensors file.
    pub fn load(path: impl AsRef<Path>, backend: Backend) -> Result<Model> {
        Model::load_with(path, ModelParams::new().backend(backend))
    }

    /// `load` with every dsq_model_params field (see `ModelParams`).
    pub fn load_with(path: impl AsRef<Path>, params: ModelParams<'_>) -> Result<Model> {
        let c_path = c_path(path.as_ref())?;
        let ModelParams { raw: mut cp, progress } = params;
        let mut f = progress;
        let mut state = f.as_mut().map(|f| Progress { f: &mut **f, panic: None });
        if let Some(s) = state.as_mut() {
            cp.progress = Some(progress_trampoline);
            cp.progress_user = s as *mut Progress<'_> as *mut c_void;
        }
        let mut raw = ptr::null_mut();
        let st = unsafe { ffi::dsq_model_load(c_path.as_ptr(), &cp, &mut raw) };
        let result = check(st);
        if let Some(payload) = state.and_then(|s| s.panic) {
            unsafe { ffi::dsq_model_free(raw) } // NULL after a cancel; no-op
            panic::resume_unwind(payload);
        }
        result?;
        let raw = NonNull::new(raw).expect("dsq_model_load returned OK and NULL");
        // From here `model` owns the handle: an error below still frees it.
        let mut model = Model { raw, info: Default::default() };
        model.info.struct_size = std::mem::size_of::<ffi::dsq_model_info>() as u32;
        check(unsafe { ffi::dsq_model_get_info(model.raw.as_ptr(), &mut model.info) })?;
        Ok(model)
    }

    /// Sizes and special tokens of the model.
    pub fn info(&self) -> &ffi::dsq_model_info {
        &self.info
    }

    /// Write the weights as the model runs them (quantized ones in the
    /// library's own format) as a checkpoint in directory `dir`
    /// (dsq_model_save; a model on the CPU backend only).
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<()> {
        let c_dir = c_path(dir.as_ref())?;
        check(unsafe { ffi::dsq_model_save(self.raw.as_ptr(), c_dir.as_ptr()) })
    }

    /// The backend running the model (Auto resolved to Cpu or Cuda).
    pub fn backend(&self) -> Backend {
        if self.info.backend == ffi::DSQ_BACKEND_CUDA { Backend::Cuda } else { Backend::Cpu }
    }

    /// The tokenizer loaded with the model (None without tokenizer.json).
    pub fn tokenizer(&self) -> Option<TokenizerRef<'_>> {
        let raw = unsafe { ffi::dsq_model_tokenizer(self.raw.as_ptr()) };
        NonNull::new(raw as *mut ffi::dsq_tokenizer).map(|raw| TokenizerRef { raw, _m: PhantomData })
    }

    /// The sampler settings the model recommends (generation_config.json).
    pub fn sampler_params(&self) -> Result<ffi::dsq_sampler_params> {
        let mut p = ffi::dsq_sampler_params::default();
        check(unsafe { ffi::dsq_model_sampler_params(self.raw.as_ptr(), &mut p) })?;
        Ok(p)
    }

    /// Stream the continuation of `prompt` (text, tokenized with the
    /// model's tokenizer) as text pieces; see `generate_tokens`.
    pub fn generate(&self, prompt: &str, opts: &GenerateOptions) -> Result<Generator<'_, '_>> {
        let tok = self.tokenizer().ok_or_else(|| invalid("this model has no tokenizer.json"))?;
        let ids = tok.tokenize(prompt, true)?;
        Generator::new(self, tok, &ids, opts)
    }

    /// Stream the continuation of token ids as text pieces, decoded with
    /// `tok` (e.g. the model's, or a Tokenizer loaded separately).  Ends at
    /// EOS, at a stop string (never yielded) or after `opts.max_tokens`.
    pub fn generate_tokens<'a, T: AsTokenizer>(&'a self, tok: &'a T, prompt: &[i32],
                                               opts: &GenerateOptions)
                                               -> Result<Generator<'a, 'a>> {
        Generator::new(self, tok.as_ref_tok(), prompt, opts)
    }

    /// Defaults for `context()`, from the library.
    pub fn context_params() -> ffi::dsq_ctx_params {
        ffi::dsq_ctx_params::default()
    }

    /// A new context (KV cache + scratch) on this model.
    pub fn context(&self, params: &ffi::dsq_ctx_params) -> Result<Context<'_>> {
        let mut raw = ptr::null_mut();
        check(unsafe { ffi::dsq_ctx_new(self.raw.as_ptr(), params, &mut raw) })?;
        Ok(Context {
            raw: NonNull::new(raw).expect("dsq_ctx_new returned OK and NULL"),
            n_vocab: self.info.n_vocab as usize,
            _model: PhantomData,
        })
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        unsafe { ffi::dsq_model_free(self.raw.as_ptr()) }
    }
}

/// KV cache and scratch for up to max_seqs sequences (dsq_ctx).  Calls take
/// `&mut self`: a context is used by one thread at a time.
pub struct Context<'m> {
    raw: NonNull<ffi::dsq_ctx>,
    n_vocab: usize,
    _model: PhantomData<&'m Model>,
}

// May move to another thread; not Sync (no concurrent use).
unsafe impl Send for Context<'_> {}

impl Context<'_> {
    /// Append `tokens` to sequence `seq`; returns the logits of the last
    /// token, `[n_vocab]`.
    pub fn prefill(&mut self, seq: i32, tokens: &[i32]) -> Result<Vec<f32>> {
        let n = i32::try_from(tokens.len()).map_err(|_| invalid("prompt longer than i32::MAX"))?;
        let mut logits = vec![0.0f32; self.n_vocab];
        check(unsafe {
            ffi::dsq_prefill(self.raw.as_ptr(), seq, tokens.as_ptr(), n, ffi::DSQ_LOGITS_LAST,
                             logits.as_mut_ptr())
        })?;
        Ok(logits)
    }

    /// One decode step: append `tokens[i]` to sequence `seqs[i]` for all i.
    /// Returns `[seqs.len()][n_vocab]` logits, row-major.
    pub fn decode_step(&mut self, seqs: &[i32], tokens: &[i32]) -> Result<Vec<f32>> {
        if seqs.len() != tokens.len() || seqs.len() > i32::MAX as usize {
            return Err(Error {
                status: ffi::DSQ_ERR_INVALID_ARG,
                message: format!("{} seqs but {} tokens", seqs.len(), tokens.len()),
            });
        }
        let mut logits = vec![0.0f32; self.n_vocab * seqs.len()];
        check(unsafe {
            ffi::dsq_decode_step(self.raw.as_ptr(), seqs.len() as i32, seqs.as_ptr(),
                                 tokens.as_ptr(), logits.as_mut_ptr())
        })?;
        Ok(logits)
    }

    /// Tokens held for sequence `seq`.
    pub fn seq_length(&self, seq: i32) -> Result<i32> {
        let mut n = 0;
        check(unsafe { ffi::dsq_seq_length(self.raw.as_ptr(), seq, &mut n) })?;
        Ok(n)
    }

    /// Drop sequence `seq` and free its cache.
    pub fn seq_remove(&mut self, seq: i32) -> Result<()> {
        check(unsafe { ffi::dsq_seq_remove(self.raw.as_ptr(), seq) })
    }

    /// Keep only the first `new_len` tokens of sequence `seq`.
    pub fn truncate(&mut self, seq: i32, new_len: i32) -> Result<()> {
        check(unsafe { ffi::dsq_seq_truncate(self.raw.as_ptr(), seq, new_len) })
    }

    /// Wait for the context's queued GPU work (a no-op on the CPU backend).
    pub fn synchronize(&mut self) -> Result<()> {
        check(unsafe { ffi::dsq_ctx_synchronize(self.raw.as_ptr()) })
    }

    /// The context's `cudaStream_t`, or `None` on the CPU backend.  The
    /// library owns it; it lives as long as the context.
    pub fn cuda_stream(&self) -> Result<Option<*mut std::ffi::c_void>> {
        let mut s: *mut std::ffi::c_void = std::ptr::null_mut();
        let st = unsafe { ffi::dsq_ctx_cuda_stream(self.raw.as_ptr(), &mut s) };
        if st == ffi::DSQ_ERR_UNSUPPORTED {
            return Ok(None);
        }
        check(st)?;
        Ok(Some(s))
    }

    /// Start (empty) sequence `dst` as a copy of sequence `src`.
    pub fn fork(&mut self, src: i32, dst: i32) -> Result<()> {
        check(unsafe { ffi::dsq_seq_fork(self.raw.as_ptr(), src, dst) })
    }

    /// Append `tokens` to sequence `seq` and draw the next token inside the
    /// library (dsq_step; on the GPU with the CUDA backend) with `sample`
    /// (e.g. `ffi::dsq_sample_params::default()`, fields changed).  Returns
    /// the id and its log-probability under the model (before penalties and
    /// temperature), or None when the logits held no finite value.  For
    /// batches of several sequences, top-n and logits use `ffi::dsq_step`.
    pub fn step_sample(&mut self, seq: i32, tokens: &[i32], sample: &ffi::dsq_sample_params)
                       -> Result<Option<(i32, f32)>> {
        let n = i32::try_from(tokens.len()).map_err(|_| invalid("too many tokens"))?;
        let entry = ffi::dsq_step_seq { seq, n_tokens: n, tokens: tokens.as_ptr(), sample,
                                        top_n: 0, flags: ffi::DSQ_STEP_LOGPROB };
        let mut out = ffi::dsq_step_out::default();
        check(unsafe { ffi::dsq_step(self.raw.as_ptr(), &entry, 1, ptr::null(), &mut out) })?;
        Ok(if out.token < 0 { None } else { Some((out.token, out.logprob)) })
    }
}

impl Drop for Context<'_> {
    fn drop(&mut self) {
        unsafe { ffi::dsq_ctx_free(self.raw.as_ptr()) }
    }
}

/// Index of the largest value (the first on ties); None for an empty slice.
pub fn argmax(row: &[f32]) -> Option<usize> {
    row.iter().enumerate().fold(None, |best: Option<(usize, f32)>, (i, &v)| match best {
        Some((_, b)) if b >= v => best,
        _ => Some((i, v)),
    }).map(|(i, _)| i)
}


/// Borrowed or owned tokenizer, for functions that take either.
pub trait AsTokenizer {
    fn as_ref_tok(&self) -> TokenizerRef<'_>;
}

/// A tokenizer loaded from a tokenizer.json (dsq_tokenizer_load); immutable,
/// so `Send + Sync`.
pub struct Tokenizer {
    raw: NonNull<ffi::dsq_tokenizer>,
}

unsafe impl Send for Tokenizer {}
unsafe impl Sync for Tokenizer {}

impl Tokenizer {
    pub fn load(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let p = c_path(path.as_ref())?;
        let mut raw = ptr::null_mut();
        check(unsafe { ffi::dsq_tokenizer_load(p.as_ptr(), &mut raw) })?;
        Ok(Tokenizer { raw: NonNull::new(raw).expect("dsq_tokenizer_load returned OK and NULL") })
    }
}

impl Drop for Tokenizer {
    fn drop(&mut self) {
        unsafe { ffi::dsq_tokenizer_free(self.raw.as_ptr()) }
    }
}

impl AsTokenizer for Tokenizer {
    fn as_ref_tok(&self) -> TokenizerRef<'_> {
        TokenizerRef { raw: self.raw, _m: PhantomData }
    }
}

impl std::ops::Deref for Tokenizer {
    type Target = TokenizerOps;
    fn deref(&self) -> &TokenizerOps {
        // SAFETY: TokenizerOps is a transparent wrapper of the handle pointer
        unsafe { &*(&self.raw as *const NonNull<ffi::dsq_tokenizer> as *const TokenizerOps) }
    }
}

/// A tokenizer borrowed from its owner (a Model or a Tokenizer).
#[derive(Clone, Copy)]
pub struct TokenizerRef<'a> {
    raw: NonNull<ffi::dsq_tokenizer>,
    _m: PhantomData<&'a ()>,
}

unsafe impl Send for TokenizerRef<'_> {}
unsafe impl Sync for TokenizerRef<'_> {}

impl AsTokenizer for TokenizerRef<'_> {
    fn as_ref_tok(&self) -> TokenizerRef<'_> {
        *self
    }
}

impl std::ops::Deref for TokenizerRef<'_> {
    type Target = TokenizerOps;
    fn deref(&self) -> &TokenizerOps {
        unsafe { &*(&self.raw as *const NonNull<ffi::dsq_tokenizer> as *const TokenizerOps) }
    }
}

/// The operations of a tokenizer, reached through `Tokenizer` or `TokenizerRef`.
#[repr(transparent)]
pub struct TokenizerOps {
    raw: NonNull<ffi::dsq_tokenizer>,
}

impl TokenizerOps {
    /// Token ids of `text`; `add_special` adds BOS as the post-processor says.
    pub fn tokenize(&self, text: &str, add_special: bool) -> Result<Vec<i32>> {
        let flags = if add_special { ffi::DSQ_TOKENIZE_ADD_SPECIAL } else { 0 };
        let mut cap = text.len() + 8;
        loop {
            let mut out = vec![0i32; cap];
            let mut n = 0usize;
            let st = unsafe {
                ffi::dsq_tokenize(self.raw.as_ptr(), text.as_ptr().cast(), text.len(), flags,
                                  out.as_mut_ptr(), cap, &mut n)
            };
            if st == ffi::DSQ_ERR_BUFFER_TOO_SMALL && n > cap {
                cap = n;
                continue;
            }
            check(st)?;
            out.truncate(n);
            return Ok(out);
        }
    }

    /// Text of token ids (invalid UTF-8 replaced).
    pub fn detokenize(&self, ids: &[i32], skip_special: bool) -> Result<String> {
        let mut cap = 16 * ids.len() + 1;
        loop {
            let mut buf = vec![0u8; cap];
            let mut n = 0usize;
            let st = unsafe {
                ffi::dsq_detokenize(self.raw.as_ptr(), ids.as_ptr(), ids.len(),
                                    skip_special as i32, buf.as_mut_ptr().cast(), cap, &mut n)
            };
            if st == ffi::DSQ_ERR_BUFFER_TOO_SMALL && n + 1 > cap {
                cap = n + 1;
                continue;
            }
            check(st)?;
            buf.truncate(n);
            return Ok(String::from_utf8_lossy(&buf).into_owned());
        }
    }

    pub fn n_tokens(&self) -> i32 {
        unsafe { ffi::dsq_tokenizer_n_tokens(self.raw.as_ptr()) }
    }

    /// EOS id, or -1.
    pub fn eos(&self) -> i32 {
        unsafe { ffi::dsq_tokenizer_eos(self.raw.as_ptr()) }
    }
}

/// Next-token sampler (dsq_sampler); one thread at a time (`Send`, not `Sync`).
pub struct Sampler {
    raw: NonNull<ffi::dsq_sampler>,
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

unsafe impl Send for Sampler {}

impl Sampler {
    /// A sampler from params (`ffi::dsq_sampler_params::default()` or
    /// `Model::sampler_params()`, fields changed as wanted).
    pub fn new(params: &ffi::dsq_sampler_params) -> Result<Sampler> {
        let mut raw = ptr::null_mut();
        check(unsafe { ffi::dsq_sampler_new(params, &mut raw) })?;
        Ok(Sampler { raw: NonNull::new(raw).expect("dsq_sampler_new returned OK and NULL"),
                     _not_sync: PhantomData })
    }

    /// Draw one token from `logits[n_vocab]` and record it.
    pub fn sample(&mut self, logits: &[f32]) -> Result<i32> {
        let n = i32::try_from(logits.len()).map_err(|_| invalid("too many logits"))?;
        let mut t = 0;
        check(unsafe { ffi::dsq_sampler_sample(self.raw.as_ptr(), logits.as_ptr(), n, &mut t) })?;
        Ok(t)
    }

    /// Record tokens (e.g. the prompt) for the repetition penalty.
    pub fn accept(&mut self, tokens: &[i32]) -> Result<()> {
        check(unsafe { ffi::dsq_sampler_accept(self.raw.as_ptr(), tokens.as_ptr(), tokens.len()) })
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        unsafe { ffi::dsq_sampler_free(self.raw.as_ptr()) }
    }
}

/// Settings of `Model::generate`.  Sampling fields left None keep the
/// model's recommended value (generation_config.json); temperature 0 is
/// greedy.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub stop: Vec<String>,
    pub temperature: Option<f32>,
    pub top_k: Option<i32>,
    pub top_p: Option<f32>,
    pub seed: Option<u64>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions { max_tokens: 256, stop: Vec::new(), temperature: None, top_k: None,
                          top_p: None, seed: None }
    }
}

/// Streaming generation: an iterator of text pieces (`Result<String>`).
/// Owns a one-sequence context, a sampler and a stopper, freed on drop.
pub struct Generator<'m, 't> {
    ctx: Context<'m>,
    sampler: Sampler,
    stopper: NonNull<ffi::dsq_stopper>,
    _tok: PhantomData<&'t ()>,
    logits: Vec<f32>,
    left: usize,
    done: bool,
    buf: Vec<u8>,
}

unsafe impl Send for Generator<'_, '_> {}

impl<'m, 't> Generator<'m, 't> {
    fn new(model: &'m Model, tok: TokenizerRef<'t>, prompt: &[i32], opts: &GenerateOptions)
           -> Result<Generator<'m, 't>> {
        if prompt.is_empty() {
            return Err(invalid("the prompt is empty"));
        }
        let mut sp = model.sampler_params()?;
        if let Some(v) = opts.temperature { sp.temperature = v; }
        if let Some(v) = opts.top_k { sp.top_k = v; }
        if let Some(v) = opts.top_p { sp.top_p = v; }
        if let Some(v) = opts.seed { sp.seed = v; }
        let max_ctx = model.info().max_context as usize;
        let n_ctx = (prompt.len() + opts.max_tokens).min(max_ctx);
        let mut params = Model::context_params();
        params.max_seqs = 1;
        params.max_context = n_ctx as i32;
        let ctx = model.context(&params)?;
        let sampler = Sampler::new(&sp)?;
        let stops: Vec<CString> = opts.stop.iter()
            .map(|s| CString::new(s.as_str()).map_err(|_| invalid("stop string with a NUL byte")))
            .collect::<Result<_>>()?;
        let ptrs: Vec<*const std::os::raw::c_char> = stops.iter().map(|s| s.as_ptr()).collect();
        let mut raw = ptr::null_mut();
        check(unsafe { ffi::dsq_stopper_new(tok.raw.as_ptr(), ptrs.as_ptr(), ptrs.len(), 1, &mut raw) })?;
        let stopper = NonNull::new(raw).expect("dsq_stopper_new returned OK and NULL");
        let longest = opts.stop.iter().map(String::len).max().unwrap_or(0);
        // from here the Generator owns everything (freed by Drop on errors too)
        let left = opts.max_tokens.min(n_ctx.saturating_sub(prompt.len()));
        let mut g = Generator { ctx, sampler, stopper, _tok: PhantomData, logits: Vec::new(), left,
                                done: false, buf: vec![0u8; 512 + longest] };
        g.sampler.accept(prompt)?;
        g.logits = g.ctx.prefill(0, prompt)?;
        Ok(g)
    }

    fn step(&mut self) -> Result<Option<String>> {
        while !self.done {
            if self.left == 0 {
                self.done = true;
                let mut n = 0usize;
                check(unsafe {
                    ffi::dsq_stopper_flush(self.stopper.as_ptr(), self.buf.as_mut_ptr().cast(),
                                           self.buf.len(), &mut n)
                })?;
                return Ok(Some(String::from_utf8_lossy(&self.buf[..n]).into_owned()));
            }
            let tok = self.sampler.sample(&self.logits)?;
            self.left -= 1;
            let (mut n, mut stopped) = (0usize, 0);
            loop {
                let st = unsafe {
                    ffi::dsq_stopper_push(self.stopper.as_ptr(), tok, self.buf.as_mut_ptr().cast(),
                                          self.buf.len(), &mut n, &mut stopped)
                };
                if st == ffi::DSQ_ERR_BUFFER_TOO_SMALL && n + 1 > self.buf.len() {
                    self.buf.resize(n + 1, 0);
                    continue;
                }
                check(st)?;
                break;
            }
            if stopped != 0 {
                self.done = true;
            } else if self.left > 0 {
                self.logits = self.ctx.decode_step(&[0], &[tok])?;
            }
            if n > 0 {
                return Ok(Some(String::from_utf8_lossy(&self.buf[..n]).into_owned()));
            }
        }
        Ok(None)
    }
}

impl Iterator for Generator<'_, '_> {
    type Item = Result<String>;
    fn next(&mut self) -> Option<Result<String>> {
        match self.step() {
            Ok(Some(s)) if s.is_empty() => self.next(),
            Ok(Some(s)) => Some(Ok(s)),
            Ok(None) => None,
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

impl Drop for Generator<'_, '_> {
    fn drop(&mut self) {
        unsafe { ffi::dsq_stopper_free(self.stopper.as_ptr()) }
    }
}

/// Render a conversation in the R1-Distill chat format (with the
/// generation prompt); `messages` are (ffi::DSQ_ROLE_*, text).
pub fn chat_format(messages: &[(i32, &str)]) -> Result<String> {
    let texts: Vec<CString> = messages.iter()
        .map(|(_, t)| CString::new(*t).map_err(|_| invalid("message with a NUL byte")))
        .collect::<Result<_>>()?;
    let msgs: Vec<ffi::dsq_chat_message> = messages.iter().zip(&texts)
        .map(|((r, _), t)| ffi::dsq_chat_message { role: *r, content: t.as_ptr() }).collect();
    let mut n = 0usize;
    let st = unsafe { ffi::dsq_chat_format(msgs.as_ptr(), msgs.len(), 1, ptr::null_mut(), 0, &mut n) };
    if st != ffi::DSQ_ERR_BUFFER_TOO_SMALL {
        check(st)?;
    }
    let mut buf = vec![0u8; n + 1];
    check(unsafe { ffi::dsq_chat_format(msgs.as_ptr(), msgs.len(), 1, buf.as_mut_ptr().cast(),
                                        buf.len(), &mut n) })?;
    buf.truncate(n);
    String::from_utf8(buf).map_err(|_| invalid("chat text is not UTF-8"))
}
