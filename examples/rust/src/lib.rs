//! A small safe wrapper over libdsqwen's C API (see `ffi` for the raw one).
//!
//! `Model` and `Context` own their handles and free them on drop; a
//! `Context<'m>` borrows its `Model`, so the compiler enforces the C rule
//! that contexts are freed before their model.  Every failing call becomes
//! an `Error` holding the status and the library's message for that call.
pub mod ffi;

use std::ffi::{CStr, CString};
use std::fmt;
use std::marker::PhantomData;
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
unsafe fn cstr(p: *const std::ffi::c_char) -> String {
    if p.is_null() { String::new() } else { CStr::from_ptr(p).to_string_lossy().into_owned() }
}

/// Version of the library actually loaded, e.g. "0.1.0".
pub fn version() -> String {
    unsafe { cstr(ffi::dsq_version_string()) }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum Backend {
    Auto = ffi::DSQ_BACKEND_AUTO,
    Cpu = ffi::DSQ_BACKEND_CPU,
    Cuda = ffi::DSQ_BACKEND_CUDA,
}

/// Loaded weights (dsq_model).  Immutable, so shareable across threads.
pub struct Model {
    raw: NonNull<ffi::dsq_model>,
    info: ffi::dsq_model_info,
}

// The header: a dsq_model is immutable after load and may be used by many
// threads and contexts at once.
unsafe impl Send for Model {}
unsafe impl Sync for Model {}

impl Model {
    /// Load a model directory (config.json + safetensors) or .safetensors file.
    pub fn load(path: impl AsRef<Path>, backend: Backend) -> Result<Model> {
        use std::os::unix::ffi::OsStrExt;
        let c_path = CString::new(path.as_ref().as_os_str().as_bytes()).map_err(|_| Error {
            status: ffi::DSQ_ERR_INVALID_ARG,
            message: "path contains a NUL byte".into(),
        })?;
        let mut params = ffi::dsq_model_params::default();
        params.backend = backend as i32;
        let mut raw = ptr::null_mut();
        check(unsafe { ffi::dsq_model_load(c_path.as_ptr(), &params, &mut raw) })?;
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
        let n = i32::try_from(tokens.len()).map_err(|_| Error {
            status: ffi::DSQ_ERR_INVALID_ARG,
            message: "prompt longer than i32::MAX".into(),
        })?;
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

#[cfg(test)]
mod tests {
    use super::ffi;
    use std::mem::size_of;

    // The structs the library fills in defaults for must match its sizes:
    // *_params_init() refuses (DSQ_ERR_STRUCT_SIZE) a size it does not know.
    #[test]
    fn struct_sizes_match_the_library() {
        unsafe {
            let mut mp: ffi::dsq_model_params = std::mem::zeroed();
            assert_eq!(ffi::dsq_model_params_init(&mut mp, size_of::<ffi::dsq_model_params>() as u32),
                       ffi::DSQ_OK);
            assert_eq!(mp.struct_size as usize, size_of::<ffi::dsq_model_params>());
            let mut cp: ffi::dsq_ctx_params = std::mem::zeroed();
            assert_eq!(ffi::dsq_ctx_params_init(&mut cp, size_of::<ffi::dsq_ctx_params>() as u32),
                       ffi::DSQ_OK);
            assert_eq!(cp.struct_size as usize, size_of::<ffi::dsq_ctx_params>());
            let mut sp: ffi::dsq_sampler_params = std::mem::zeroed();
            assert_eq!(ffi::dsq_sampler_params_init(&mut sp,
                                                    size_of::<ffi::dsq_sampler_params>() as u32),
                       ffi::DSQ_OK);
            assert_eq!(sp.struct_size as usize, size_of::<ffi::dsq_sampler_params>());
        }
        assert_eq!(ffi::dsq_model_params::default().struct_size as usize,
                   size_of::<ffi::dsq_model_params>());
        assert_eq!(ffi::dsq_ctx_params::default().struct_size as usize,
                   size_of::<ffi::dsq_ctx_params>());
        assert_eq!(ffi::dsq_sampler_params::default().struct_size as usize,
                   size_of::<ffi::dsq_sampler_params>());
    }

    // Default must carry the library's defaults, not the zeros it starts from.
    #[test]
    fn default_params_come_from_the_library() {
        assert_eq!(ffi::dsq_model_params::default().load_tokenizer, 1);
    }

    #[test]
    fn missing_model_is_an_io_error() {
        let e = super::Model::load("/nonexistent/model", super::Backend::Cpu).err().unwrap();
        assert_eq!(e.status, ffi::DSQ_ERR_IO);
        assert!(e.to_string().contains("DSQ_ERR_IO"), "{e}");
    }

    #[test]
    fn argmax_takes_the_first_maximum() {
        assert_eq!(super::argmax(&[1.0, 3.0, 3.0, -1.0]), Some(1));
        assert_eq!(super::argmax(&[]), None);
    }
}
