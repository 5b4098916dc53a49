//! dsqwen-sys: raw declarations of libdsqwen's include/dsqwen.h, item for
//! item (C names kept so the header's documentation applies unchanged).  C
//! enums are passed as `c_int` / `i32` constants: the library may return
//! values this file does not know.  Hand-written (the header is small and
//! stable); `cargo test` checks the struct sizes against the library.
//!
//! Linking: see build.rs (pkg-config `dsqwen`, or $DSQWEN_LIB_DIR).  The safe
//! API is the `dsqwen` crate.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_uint, c_void};
use std::marker::{PhantomData, PhantomPinned};

pub const DSQ_VERSION_MAJOR: u32 = 0;

/// `dsq_status`: 0 is DSQ_OK, errors are negative with fixed values.
pub type dsq_status = c_int;
pub const DSQ_OK: dsq_status = 0;
pub const DSQ_ERR_INVALID_ARG: dsq_status = -1;
pub const DSQ_ERR_STRUCT_SIZE: dsq_status = -2;
pub const DSQ_ERR_OUT_OF_MEMORY: dsq_status = -3;
pub const DSQ_ERR_IO: dsq_status = -4;
pub const DSQ_ERR_FORMAT: dsq_status = -5;
pub const DSQ_ERR_CONFIG: dsq_status = -6;
pub const DSQ_ERR_UNSUPPORTED: dsq_status = -7;
pub const DSQ_ERR_MISSING_TENSOR: dsq_status = -8;
pub const DSQ_ERR_SHAPE: dsq_status = -9;
pub const DSQ_ERR_DTYPE: dsq_status = -10;
pub const DSQ_ERR_TOKEN: dsq_status = -11;
pub const DSQ_ERR_SEQ: dsq_status = -12;
pub const DSQ_ERR_CONTEXT_FULL: dsq_status = -13;
pub const DSQ_ERR_KV_FULL: dsq_status = -14;
pub const DSQ_ERR_BATCH: dsq_status = -15;
pub const DSQ_ERR_BUFFER_TOO_SMALL: dsq_status = -16;
pub const DSQ_ERR_NO_DEVICE: dsq_status = -17;
pub const DSQ_ERR_DEVICE_OOM: dsq_status = -18;
pub const DSQ_ERR_DEVICE: dsq_status = -19;
pub const DSQ_ERR_INTERNAL: dsq_status = -20;
pub const DSQ_ERR_CANCELLED: dsq_status = -21;

pub const DSQ_LOG_ERROR: c_int = 0;
pub const DSQ_LOG_WARN: c_int = 1;
pub const DSQ_LOG_INFO: c_int = 2;
pub const DSQ_LOG_DEBUG: c_int = 3;

pub const DSQ_BACKEND_AUTO: i32 = 0;
pub const DSQ_BACKEND_CPU: i32 = 1;
pub const DSQ_BACKEND_CUDA: i32 = 2;
pub const DSQ_KV_STATIC: i32 = 0;
pub const DSQ_KV_PAGED: i32 = 1;
pub const DSQ_KV_F16: i32 = 0;
pub const DSQ_KV_INT8: i32 = 1;
pub const DSQ_KV_F32: i32 = 2;
pub const DSQ_QUANTIZE_NONE: i32 = 0;
pub const DSQ_QUANTIZE_INT8: i32 = 1;
pub const DSQ_QUANTIZE_Q4: i32 = 2;
pub const DSQ_TP_ID_BYTES: usize = 128;
pub const DSQ_ROLE_SYSTEM: i32 = 0;
pub const DSQ_ROLE_USER: i32 = 1;
pub const DSQ_ROLE_ASSISTANT: i32 = 2;

pub const DSQ_LOGITS_LAST: u32 = 0;
pub const DSQ_LOGITS_ALL: u32 = 1;
pub const DSQ_TOKENIZE_ADD_SPECIAL: u32 = 1;
pub const DSQ_TOKENIZE_PLAIN_SPECIAL: u32 = 2;
pub const DSQ_STEP_MAX_TOP_N: usize = 20;
pub const DSQ_PENALTY_MAX_N: i32 = 4096;
pub const DSQ_STEP_LOGITS: u32 = 1;
pub const DSQ_STEP_LOGPROB: u32 = 2;

// Opaque handles: only ever behind pointers, neither Send, Sync nor Unpin.
macro_rules! opaque {
    ($($name:ident),*) => {$(
        #[repr(C)]
        pub struct $name {
            _data: [u8; 0],
            _marker: PhantomData<(*mut u8, PhantomPinned)>,
        }
    )*};
}
opaque!(dsq_model, dsq_ctx, dsq_tokenizer, dsq_detok_stream, dsq_sampler, dsq_stopper);

pub type dsq_log_fn = Option<unsafe extern "C" fn(level: c_int, message: *const c_char, user: *mut c_void)>;
/// Load progress: return 0 to continue, nonzero to cancel (DSQ_ERR_CANCELLED).
pub type dsq_progress_fn = Option<unsafe extern "C" fn(fraction: f32, user: *mut c_void) -> c_int>;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct dsq_model_params {
    pub struct_size: u32,
    pub backend: i32,
    pub device: i32,
    pub n_threads: i32,
    pub load_tokenizer: i32,
    // appended after 0.1.0
    pub skip_finite_check: i32,
    pub copy_weights: i32,
    pub progress: dsq_progress_fn,
    pub progress_user: *mut c_void,
    // appended in 0.2.0
    pub quantize: i32,
    pub quantize_head: i32,
    pub tp_world: i32,
    pub tp_devices: *const i32,
    pub tp_rank: i32,
    pub tp_id: *const c_void,
    pub tp_timeout_s: f32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct dsq_model_info {
    pub struct_size: u32,
    pub backend: i32,
    pub n_vocab: i32,
    pub n_embd: i32,
    pub n_layers: i32,
    pub n_heads: i32,
    pub n_kv_heads: i32,
    pub head_dim: i32,
    pub n_ff: i32,
    pub max_context: i32,
    pub tie_embeddings: i32,
    pub rope_theta: f32,
    pub rms_norm_eps: f32,
    pub n_params: i64,
    pub weight_bytes: i64,
    pub device_bytes: i64,
    pub bos_token: i32,
    pub eos_token: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct dsq_ctx_params {
    pub struct_size: u32,
    pub max_seqs: i32,
    pub max_context: i32,
    pub max_batch_tokens: i32,
    pub kv_layout: i32,
    pub kv_dtype: i32,
    pub kv_block_size: i32,
    pub kv_pool_tokens: i64,
    pub kv_budget_bytes: i64,
    pub n_threads: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct dsq_ctx_info {
    pub struct_size: u32,
    pub backend: i32,
    pub kv_layout: i32,
    pub kv_dtype: i32,
    pub max_seqs: i32,
    pub max_context: i32,
    pub max_batch_tokens: i32,
    pub kv_block_size: i32,
    pub kv_bytes_per_token: i64,
    pub kv_capacity_tokens: i64,
    pub kv_free_tokens: i64,
    pub kv_bytes: i64,
    pub scratch_bytes: i64,
    pub n_threads: i32,
    pub n_active_seqs: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct dsq_chat_message {
    pub role: i32,
    pub content: *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct dsq_sampler_params {
    pub struct_size: u32,
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub penalty_last_n: i32,
    pub seed: u64,
    pub n_vocab_valid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct dsq_sample_params {
    pub struct_size: u32,
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub penalty_last_n: i32,
    pub seed: u64,
    pub n_vocab_valid: i32,
}

/// One entry of a dsq_step() batch (fixed layout: an array element).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct dsq_step_seq {
    pub seq: i32,
    pub n_tokens: i32,
    pub tokens: *const i32,
    pub sample: *const dsq_sample_params,
    pub top_n: i32,
    pub flags: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct dsq_step_out {
    pub token: i32,
    pub logprob: f32,
    pub n_top: i32,
    pub top_ids: [i32; DSQ_STEP_MAX_TOP_N],
    pub top_logprobs: [f32; DSQ_STEP_MAX_TOP_N],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct dsq_step_params {
    pub struct_size: u32,
    pub logits: *mut f32,
    pub logits_on_device: i32,
}

extern "C" {
    pub fn dsq_version_string() -> *const c_char;
    pub fn dsq_version_number() -> c_uint;
    pub fn dsq_build_features() -> *const c_char;
    pub fn dsq_backend_available(backend: c_int) -> c_int;
    pub fn dsq_status_string(status: dsq_status) -> *const c_char;
    pub fn dsq_last_error_message() -> *const c_char;
    pub fn dsq_set_log_callback(f: dsq_log_fn, user: *mut c_void, max_level: c_int);

    // dsq_*_default_params() are static inline in the header, so not in the
    // library: fill params with dsq_*_params_init() (or `Default`, below).
    pub fn dsq_model_params_init(params: *mut dsq_model_params, struct_size: u32) -> dsq_status;
    pub fn dsq_model_load(path: *const c_char, params: *const dsq_model_params,
                          out: *mut *mut dsq_model) -> dsq_status;
    pub fn dsq_model_free(model: *mut dsq_model);
    pub fn dsq_model_get_info(model: *const dsq_model, info: *mut dsq_model_info) -> dsq_status;
    pub fn dsq_model_save(model: *const dsq_model, out_dir: *const c_char) -> dsq_status;

    pub fn dsq_ctx_params_init(params: *mut dsq_ctx_params, struct_size: u32) -> dsq_status;
    pub fn dsq_ctx_new(model: *mut dsq_model, params: *const dsq_ctx_params,
                       out: *mut *mut dsq_ctx) -> dsq_status;
    pub fn dsq_ctx_free(ctx: *mut dsq_ctx);
    pub fn dsq_ctx_last_error(ctx: *const dsq_ctx) -> *const c_char;
    pub fn dsq_ctx_get_info(ctx: *const dsq_ctx, info: *mut dsq_ctx_info) -> dsq_status;
    pub fn dsq_ctx_synchronize(ctx: *mut dsq_ctx) -> dsq_status;
    pub fn dsq_tp_unique_id(id: *mut c_void, size: usize) -> dsq_status;
    pub fn dsq_ctx_cuda_stream(ctx: *const dsq_ctx, stream: *mut *mut c_void) -> dsq_status;

    pub fn dsq_prefill(ctx: *mut dsq_ctx, seq: i32, tokens: *const i32, n_tokens: i32,
                       flags: u32, logits: *mut f32) -> dsq_status;
    pub fn dsq_decode_step(ctx: *mut dsq_ctx, n_seqs: i32, seqs: *const i32,
                           tokens: *const i32, logits: *mut f32) -> dsq_status;
    pub fn dsq_seq_remove(ctx: *mut dsq_ctx, seq: i32) -> dsq_status;
    pub fn dsq_seq_length(ctx: *const dsq_ctx, seq: i32, n_out: *mut i32) -> dsq_status;
    pub fn dsq_seq_truncate(ctx: *mut dsq_ctx, seq: i32, new_len: i32) -> dsq_status;
    pub fn dsq_seq_fork(ctx: *mut dsq_ctx, src: i32, dst: i32) -> dsq_status;

    pub fn dsq_sample_params_init(params: *mut dsq_sample_params, struct_size: u32)
        -> dsq_status;
    pub fn dsq_step_params_init(params: *mut dsq_step_params, struct_size: u32) -> dsq_status;
    pub fn dsq_step(ctx: *mut dsq_ctx, seqs: *const dsq_step_seq, n_seqs: i32,
                    params: *const dsq_step_params, out: *mut dsq_step_out) -> dsq_status;

    pub fn dsq_tokenizer_load(path: *const c_char, out: *mut *mut dsq_tokenizer) -> dsq_status;
    pub fn dsq_tokenizer_free(tok: *mut dsq_tokenizer);
    pub fn dsq_model_tokenizer(model: *const dsq_model) -> *const dsq_tokenizer;
    pub fn dsq_tokenize(tok: *const dsq_tokenizer, text: *const c_char, len: usize, flags: u32,
                        tokens: *mut i32, cap: usize, n_out: *mut usize) -> dsq_status;
    pub fn dsq_detokenize(tok: *const dsq_tokenizer, tokens: *const i32, n: usize,
                          skip_special: c_int, text: *mut c_char, cap: usize,
                          len_out: *mut usize) -> dsq_status;
    pub fn dsq_tokenizer_n_tokens(tok: *const dsq_tokenizer) -> i32;
    pub fn dsq_tokenizer_token_id(tok: *const dsq_tokenizer, text: *const c_char) -> i32;
    pub fn dsq_token_text(tok: *const dsq_tokenizer, id: i32) -> *const c_char;
    pub fn dsq_token_is_special(tok: *const dsq_tokenizer, id: i32) -> c_int;
    pub fn dsq_tokenizer_bos(tok: *const dsq_tokenizer) -> i32;
    pub fn dsq_tokenizer_eos(tok: *const dsq_tokenizer) -> i32;

    pub fn dsq_detok_stream_new(tok: *const dsq_tokenizer, skip_special: c_int,
                                out: *mut *mut dsq_detok_stream) -> dsq_status;
    pub fn dsq_detok_stream_free(s: *mut dsq_detok_stream);
    pub fn dsq_detok_stream_push(s: *mut dsq_detok_stream, token: i32, text: *mut c_char,
                                 cap: usize, len_out: *mut usize) -> dsq_status;
    pub fn dsq_detok_stream_flush(s: *mut dsq_detok_stream, text: *mut c_char, cap: usize,
                                  len_out: *mut usize) -> dsq_status;

    pub fn dsq_chat_format(msgs: *const dsq_chat_message, n_msgs: usize,
                           add_generation_prompt: c_int, text: *mut c_char, cap: usize,
                           len_out: *mut usize) -> dsq_status;

    pub fn dsq_sampler_params_init(params: *mut dsq_sampler_params, struct_size: u32)
        -> dsq_status;
    pub fn dsq_sampler_new(params: *const dsq_sampler_params, out: *mut *mut dsq_sampler)
        -> dsq_status;
    pub fn dsq_sampler_free(s: *mut dsq_sampler);
    pub fn dsq_sampler_sample(s: *mut dsq_sampler, logits: *const f32, n_vocab: i32,
                              token_out: *mut i32) -> dsq_status;
    pub fn dsq_sampler_accept(s: *mut dsq_sampler, tokens: *const i32, n: usize) -> dsq_status;
    pub fn dsq_sampler_reset(s: *mut dsq_sampler, seed: u64);
    pub fn dsq_model_sampler_params(model: *const dsq_model, params: *mut dsq_sampler_params)
        -> dsq_status;

    pub fn dsq_stopper_new(tok: *const dsq_tokenizer, stop_strings: *const *const c_char,
                           n_stop: usize, stop_on_eos: c_int, out: *mut *mut dsq_stopper)
        -> dsq_status;
    pub fn dsq_stopper_free(s: *mut dsq_stopper);
    pub fn dsq_stopper_push(s: *mut dsq_stopper, token: i32, text: *mut c_char, cap: usize,
                            len_out: *mut usize, stopped: *mut c_int) -> dsq_status;
    pub fn dsq_stopper_flush(s: *mut dsq_stopper, text: *mut c_char, cap: usize,
                             len_out: *mut usize) -> dsq_status;
    pub fn dsq_stopper_reset(s: *mut dsq_stopper);
}

// The Rust counterpart of the header's inline dsq_*_default_params(): start
// from zeros with struct_size = size_of (this file's layout), let the library
// write its defaults over the whole struct.  As in C the status is dropped: a
// library older than these structs refuses to fill them, and the zeroed
// struct is then refused with DSQ_ERR_STRUCT_SIZE where it is used.
macro_rules! default_via_init {
    ($($ty:ident => $init:ident),*) => {$(
        impl Default for $ty {
            fn default() -> $ty {
                // SAFETY: a repr(C) struct of integers, floats, raw
                // pointers and Option<fn> only, for all of which all-zero
                // bytes are a valid value (0, NULL, None); `init` writes at
                // most size_of::<$ty>() bytes into it.
                unsafe {
                    let mut p: $ty = std::mem::zeroed();
                    p.struct_size = std::mem::size_of::<$ty>() as u32;
                    let _ = $init(&mut p, p.struct_size);
                    p
                }
            }
        }
    )*};
}
default_via_init!(dsq_model_params => dsq_model_params_init,
                  dsq_ctx_params => dsq_ctx_params_init,
                  dsq_sampler_params => dsq_sampler_params_init,
                  dsq_sample_params => dsq_sample_params_init,
                  dsq_step_params => dsq_step_params_init);

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    // *_params_init() refuses (DSQ_ERR_STRUCT_SIZE) a size it does not know,
    // and sets struct_size: both show the layouts here match the library's.
    #[test]
    fn struct_sizes_match_the_library() {
        unsafe {
            let mut mp: dsq_model_params = std::mem::zeroed();
            assert_eq!(dsq_model_params_init(&mut mp, size_of::<dsq_model_params>() as u32), DSQ_OK);
            assert_eq!(mp.struct_size as usize, size_of::<dsq_model_params>());
            let mut cp: dsq_ctx_params = std::mem::zeroed();
            assert_eq!(dsq_ctx_params_init(&mut cp, size_of::<dsq_ctx_params>() as u32), DSQ_OK);
            assert_eq!(cp.struct_size as usize, size_of::<dsq_ctx_params>());
            let mut sp: dsq_sampler_params = std::mem::zeroed();
            assert_eq!(dsq_sampler_params_init(&mut sp, size_of::<dsq_sampler_params>() as u32),
                       DSQ_OK);
            assert_eq!(sp.struct_size as usize, size_of::<dsq_sampler_params>());
        }
        assert_eq!(dsq_model_params::default().struct_size as usize, size_of::<dsq_model_params>());
        // Default carries the library's defaults, not the zeros it starts from
        let d = dsq_model_params::default();
        assert_eq!(d.load_tokenizer, 1);
        assert!(d.progress.is_none() && d.progress_user.is_null());
        assert_eq!((d.skip_finite_check, d.copy_weights), (0, 0));
        assert_eq!((d.quantize, d.quantize_head, d.tp_world, d.tp_rank), (0, 0, 0, 0));
        assert!(d.tp_devices.is_null() && d.tp_id.is_null() && d.tp_timeout_s == 0.0);
    }

    #[test]
    fn features_and_backends() {
        let f = unsafe { std::ffi::CStr::from_ptr(dsq_build_features()) }.to_str().unwrap();
        assert!(f.split(' ').any(|w| w == "cpu"), "{f}");
        assert_eq!(unsafe { dsq_backend_available(DSQ_BACKEND_CPU) }, 1);
        assert_eq!(unsafe { dsq_backend_available(99) }, 0);
    }

    // Accepted at our size and refused one byte above it: the library's
    // struct is exactly as large as ours (init refuses sizes above its own).
    #[test]
    fn struct_sizes_are_the_librarys_exactly() {
        let mut buf = [0u64; 64];
        let p = buf.as_mut_ptr();
        unsafe {
            let n = size_of::<dsq_model_params>() as u32;
            assert_eq!(dsq_model_params_init(p.cast(), n + 1), DSQ_ERR_STRUCT_SIZE);
            let n = size_of::<dsq_ctx_params>() as u32;
            assert_eq!(dsq_ctx_params_init(p.cast(), n + 1), DSQ_ERR_STRUCT_SIZE);
            let n = size_of::<dsq_sampler_params>() as u32;
            assert_eq!(dsq_sampler_params_init(p.cast(), n + 1), DSQ_ERR_STRUCT_SIZE);
            let n = size_of::<dsq_sample_params>() as u32;
            assert_eq!(dsq_sample_params_init(p.cast(), n), DSQ_OK);
            assert_eq!(dsq_sample_params_init(p.cast(), n + 1), DSQ_ERR_STRUCT_SIZE);
            let n = size_of::<dsq_step_params>() as u32;
            assert_eq!(dsq_step_params_init(p.cast(), n), DSQ_OK);
            assert_eq!(dsq_step_params_init(p.cast(), n + 1), DSQ_ERR_STRUCT_SIZE);
        }
    }

    #[test]
    fn version_major_matches() {
        assert_eq!(unsafe { dsq_version_number() } / 10000, DSQ_VERSION_MAJOR);
    }
}
