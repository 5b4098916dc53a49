// Package dsqwen is the Go binding of libdsqwen's C API (cgo): load a
// model, create contexts, prefill and decode, tokenize, and stream
// generated text.  Handles are freed with Close(); close every Context
// before its Model and every Tokenizer after the generations using it.
//
// Thread rules follow the C header: a Model and a Tokenizer may be used by
// many goroutines at once; a Context belongs to one goroutine at a time.
//
// Build flags come from pkg-config (`#cgo pkg-config: dsqwen`): a library
// installed in the default prefix (/usr/local, then `ldconfig`) needs
// nothing; another prefix needs PKG_CONFIG_PATH=PREFIX/lib/pkgconfig to
// build and the loader to find PREFIX/lib at run time.
package dsqwen

/*
#cgo pkg-config: dsqwen
#include <stdlib.h>
#include "dsqwen.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// Backend selects where the model runs (dsq_backend).
type Backend int32

const (
	BackendAuto Backend = C.DSQ_BACKEND_AUTO
	BackendCPU  Backend = C.DSQ_BACKEND_CPU
	BackendCUDA Backend = C.DSQ_BACKEND_CUDA
)

// Status values of Error.Status (dsq_status; fixed by the C header).
const (
	StatusInvalidArg     = int(C.DSQ_ERR_INVALID_ARG)
	StatusStructSize     = int(C.DSQ_ERR_STRUCT_SIZE)
	StatusOutOfMemory    = int(C.DSQ_ERR_OUT_OF_MEMORY)
	StatusIO             = int(C.DSQ_ERR_IO)
	StatusFormat         = int(C.DSQ_ERR_FORMAT)
	StatusConfig         = int(C.DSQ_ERR_CONFIG)
	StatusUnsupported    = int(C.DSQ_ERR_UNSUPPORTED)
	StatusMissingTensor  = int(C.DSQ_ERR_MISSING_TENSOR)
	StatusShape          = int(C.DSQ_ERR_SHAPE)
	StatusDtype          = int(C.DSQ_ERR_DTYPE)
	StatusToken          = int(C.DSQ_ERR_TOKEN)
	StatusSeq            = int(C.DSQ_ERR_SEQ)
	StatusContextFull    = int(C.DSQ_ERR_CONTEXT_FULL)
	StatusKVFull         = int(C.DSQ_ERR_KV_FULL)
	StatusBatch          = int(C.DSQ_ERR_BATCH)
	StatusBufferTooSmall = int(C.DSQ_ERR_BUFFER_TOO_SMALL)
	StatusNoDevice       = int(C.DSQ_ERR_NO_DEVICE)
	StatusDeviceOOM      = int(C.DSQ_ERR_DEVICE_OOM)
	StatusDevice         = int(C.DSQ_ERR_DEVICE)
	StatusInternal       = int(C.DSQ_ERR_INTERNAL)
	StatusCancelled      = int(C.DSQ_ERR_CANCELLED) // the progress callback cancelled a load
)

// Error is a failed libdsqwen call.
type Error struct {
	Status  int    // the negative dsq_status value
	Name    string // dsq_status_string(Status)
	Message string // the library's message for this call
}

func (e *Error) Error() string { return fmt.Sprintf("%s (%s)", e.Name, e.Message) }

// call runs one fallible C call and turns its status into an error.  The
// last-error message is thread-local in C while goroutines move between OS
// threads, so the call and the read of its message share a locked thread.
func call(f func() C.dsq_status) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	st := f()
	if st == C.DSQ_OK {
		return nil
	}
	return &Error{Status: int(st), Name: C.GoString(C.dsq_status_string(st)),
		Message: C.GoString(C.dsq_last_error_message())}
}

// Version of the library actually loaded, e.g. "0.1.0".
func Version() string { return C.GoString(C.dsq_version_string()) }

// BuildFeatures says what the library was built with: space-separated
// words, "cpu" always, "cuda" when the CUDA backend is compiled in.
func BuildFeatures() string { return C.GoString(C.dsq_build_features()) }

// BackendAvailable reports whether b can be used on this machine now
// (BackendCUDA: compiled in and a usable device found).
func BackendAvailable(b Backend) bool { return C.dsq_backend_available(C.dsq_backend(b)) != 0 }

// Model is loaded weights (dsq_model); safe for concurrent use.
type Model struct {
	p          *C.dsq_model
	NVocab     int   // logits width
	MaxContext int   // longest sequence the model supports
	BOSToken   int32 // -1 if the config has none
	EOSToken   int32 // -1 if the config has none
}

// Load reads a model directory (config.json + safetensors).
func Load(path string, backend Backend) (*Model, error) {
	return LoadWithOptions(path, LoadOptions{Backend: backend})
}

// Quantize is a weight quantization at load (dsq_quantize; docs/quantization.md).
type Quantize int32

const (
	QuantizeNone Quantize = 0 // as the checkpoint stores them
	QuantizeInt8 Quantize = 1 // int8, one scale per output row
	QuantizeQ4   Quantize = 2 // 4-bit, groups of 128 inputs with a scale and a zero point
)

// LoadOptions are the settings of LoadWithOptions (dsq_model_params); the
// zero value is the library's defaults.
type LoadOptions struct {
	Backend         Backend
	Device          int      // CUDA device index
	NThreads        int      // CPU threads for the load-time weight scan; 0: all cores
	NoTokenizer     bool     // do not load tokenizer.json
	SkipFiniteCheck bool     // do not refuse weights holding NaN or Inf
	CopyWeights     bool     // CPU: copy the weights instead of computing from the mapped files
	Quantize        Quantize // quantize the linear weights at load (QuantizeNone: as stored)
	QuantizeHead    bool     // with Quantize: the output head too (int8)
	// Progress, if not nil, is called during the load on the loading
	// goroutine with fractions in [0, 1] that never decrease, the last one
	// 1.  Returning false cancels the load (an *Error with Status
	// StatusCancelled).  A panic in it cancels the load and is re-raised
	// from LoadWithOptions.
	Progress func(fraction float32) bool
}

// LoadWithOptions is Load with every load setting.
func LoadWithOptions(path string, opts LoadOptions) (*Model, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	// The library's defaults, for this header's struct size (the header's
	// inline dsq_model_default_params() would do the same).
	var params C.dsq_model_params
	if err := call(func() C.dsq_status {
		return C.dsq_model_params_init(&params, C.uint32_t(unsafe.Sizeof(params)))
	}); err != nil {
		return nil, err
	}
	params.backend = C.int32_t(opts.Backend)
	params.device = C.int32_t(opts.Device)
	params.n_threads = C.int32_t(opts.NThreads)
	params.load_tokenizer = cbool(!opts.NoTokenizer)
	params.skip_finite_check = cbool(opts.SkipFiniteCheck)
	params.copy_weights = cbool(opts.CopyWeights)
	params.quantize = C.int32_t(opts.Quantize)
	params.quantize_head = cbool(opts.QuantizeHead)
	var progress *progressState
	if opts.Progress != nil {
		progress = &progressState{fn: opts.Progress}
		defer setProgress(&params, progress)()
	}
	m := &Model{}
	err := call(func() C.dsq_status { return C.dsq_model_load(cpath, &params, &m.p) })
	if progress != nil && progress.panicked {
		C.dsq_model_free(m.p) // NULL after a cancel: a no-op
		panic(progress.panicVal)
	}
	if err != nil {
		return nil, err
	}
	var info C.dsq_model_info
	info.struct_size = C.uint32_t(unsafe.Sizeof(info))
	if err := call(func() C.dsq_status { return C.dsq_model_get_info(m.p, &info) }); err != nil {
		m.Close()
		return nil, err
	}
	m.NVocab, m.BOSToken, m.EOSToken = int(info.n_vocab), int32(info.bos_token), int32(info.eos_token)
	m.MaxContext = int(info.max_context)
	return m, nil
}

func cbool(b bool) C.int32_t {
	if b {
		return 1
	}
	return 0
}

// Close frees the model; its contexts must be closed already.
func (m *Model) Close() {
	C.dsq_model_free(m.p)
	m.p = nil
}

// Context is a KV cache plus scratch (dsq_ctx); one goroutine at a time.
type Context struct {
	p      *C.dsq_ctx
	nVocab int
}

// NewContext creates a context for maxSeqs sequences of up to maxContext
// tokens each (0 keeps the library's default for either).
// Save writes the weights as the model runs them (quantized ones in the
// library's own format) as a checkpoint in directory dir (dsq_model_save;
// a model on the CPU backend only).
func (m *Model) Save(dir string) error {
	cdir := C.CString(dir)
	defer C.free(unsafe.Pointer(cdir))
	return call(func() C.dsq_status { return C.dsq_model_save(m.p, cdir) })
}

func (m *Model) NewContext(maxSeqs, maxContext int) (*Context, error) {
	var params C.dsq_ctx_params
	if err := call(func() C.dsq_status {
		return C.dsq_ctx_params_init(&params, C.uint32_t(unsafe.Sizeof(params)))
	}); err != nil {
		return nil, err
	}
	if maxSeqs > 0 {
		params.max_seqs = C.int32_t(maxSeqs)
	}
	if maxContext > 0 {
		params.max_context = C.int32_t(maxContext)
	}
	c := &Context{nVocab: m.NVocab}
	if err := call(func() C.dsq_status { return C.dsq_ctx_new(m.p, &params, &c.p) }); err != nil {
		return nil, err
	}
	return c, nil
}

// Close frees the context and its cache.
func (c *Context) Close() {
	C.dsq_ctx_free(c.p)
	c.p = nil
}

// Prefill appends tokens to sequence seq and returns the last token's
// logits, [NVocab].
func (c *Context) Prefill(seq int32, tokens []int32) ([]float32, error) {
	if len(tokens) == 0 {
		return nil, fmt.Errorf("dsqwen: empty prompt")
	}
	logits := make([]float32, c.nVocab)
	err := call(func() C.dsq_status {
		return C.dsq_prefill(c.p, C.int32_t(seq), (*C.int32_t)(unsafe.Pointer(&tokens[0])),
			C.int32_t(len(tokens)), C.DSQ_LOGITS_LAST, (*C.float)(unsafe.Pointer(&logits[0])))
	})
	return logits, err
}

// DecodeStep appends tokens[i] to sequence seqs[i] for every i in one batch
// and returns [len(seqs)][NVocab] logits, row-major.
func (c *Context) DecodeStep(seqs, tokens []int32) ([]float32, error) {
	if len(seqs) == 0 || len(seqs) != len(tokens) {
		return nil, fmt.Errorf("dsqwen: %d seqs but %d tokens", len(seqs), len(tokens))
	}
	logits := make([]float32, c.nVocab*len(seqs))
	err := call(func() C.dsq_status {
		return C.dsq_decode_step(c.p, C.int32_t(len(seqs)), (*C.int32_t)(unsafe.Pointer(&seqs[0])),
			(*C.int32_t)(unsafe.Pointer(&tokens[0])), (*C.float)(unsafe.Pointer(&logits[0])))
	})
	return logits, err
}

// Argmax is the index of the largest value (the first on ties).
func Argmax(row []float32) int {
	best := 0
	for i, v := range row {
		if v > row[best] {
			best = i
		}
	}
	return best
}

// Tokenizer is a byte-level BPE tokenizer (dsq_tokenizer); safe for
// concurrent use.  One from Model.Tokenizer() is owned by the model.
type Tokenizer struct {
	p     *C.dsq_tokenizer
	owned bool
}

// LoadTokenizer reads a tokenizer.json.
func LoadTokenizer(path string) (*Tokenizer, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	t := &Tokenizer{owned: true}
	if err := call(func() C.dsq_status { return C.dsq_tokenizer_load(cpath, &t.p) }); err != nil {
		return nil, err
	}
	return t, nil
}

// Tokenizer is the model's own tokenizer (nil without tokenizer.json);
// valid until the model is closed.
func (m *Model) Tokenizer() *Tokenizer {
	p := C.dsq_model_tokenizer(m.p)
	if p == nil {
		return nil
	}
	return &Tokenizer{p: (*C.dsq_tokenizer)(unsafe.Pointer(p))}
}

// Close frees a loaded tokenizer (a model's is left to the model).
func (t *Tokenizer) Close() {
	if t.owned {
		C.dsq_tokenizer_free(t.p)
	}
	t.p = nil
}

// Tokenize returns the ids of text; addSpecial adds BOS as the tokenizer says.
func (t *Tokenizer) Tokenize(text string, addSpecial bool) ([]int32, error) {
	ctext := C.CString(text)
	defer C.free(unsafe.Pointer(ctext))
	flags := C.uint32_t(0)
	if addSpecial {
		flags = C.DSQ_TOKENIZE_ADD_SPECIAL
	}
	out := make([]int32, len(text)+8)
	var n C.size_t
	for {
		err := call(func() C.dsq_status {
			return C.dsq_tokenize(t.p, ctext, C.size_t(len(text)), flags,
				(*C.int32_t)(unsafe.Pointer(&out[0])), C.size_t(len(out)), &n)
		})
		if e, ok := err.(*Error); ok && e.Status == int(C.DSQ_ERR_BUFFER_TOO_SMALL) && int(n) > len(out) {
			out = make([]int32, int(n))
			continue
		}
		if err != nil {
			return nil, err
		}
		return out[:int(n)], nil
	}
}

// Detokenize returns the text of ids (invalid UTF-8 replaced by U+FFFD).
func (t *Tokenizer) Detokenize(ids []int32, skipSpecial bool) (string, error) {
	if len(ids) == 0 {
		return "", nil
	}
	skip := C.int(0)
	if skipSpecial {
		skip = 1
	}
	buf := make([]byte, 16*len(ids)+1)
	var n C.size_t
	for {
		err := call(func() C.dsq_status {
			return C.dsq_detokenize(t.p, (*C.int32_t)(unsafe.Pointer(&ids[0])), C.size_t(len(ids)), skip,
				(*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &n)
		})
		if e, ok := err.(*Error); ok && e.Status == int(C.DSQ_ERR_BUFFER_TOO_SMALL) && int(n)+1 > len(buf) {
			buf = make([]byte, int(n)+1)
			continue
		}
		if err != nil {
			return "", err
		}
		return string(buf[:int(n)]), nil
	}
}

// GenerateOptions: MaxTokens to generate, Stop strings (never shown), and
// sampling; Temperature < 0 keeps the model's recommended value
// (generation_config.json), 0 is greedy.
type GenerateOptions struct {
	MaxTokens   int
	Stop        []string
	Temperature float32
	Seed        uint64
}

// Generate streams the continuation of prompt ids as text pieces: emit is
// called with each piece as it becomes safe to show (returning false stops
// early).  Ends at EOS, at a stop string or after MaxTokens.  tok decodes
// the ids (the model's own, or one loaded separately).  It makes and frees
// its own one-sequence context, so one Model can serve several goroutines.
func (m *Model) Generate(tok *Tokenizer, prompt []int32, opts GenerateOptions, emit func(string) bool) error {
	if tok == nil || len(prompt) == 0 || opts.MaxTokens <= 0 {
		return fmt.Errorf("dsqwen: Generate needs a tokenizer, a prompt and MaxTokens > 0")
	}
	nctx := len(prompt) + opts.MaxTokens
	if nctx > m.MaxContext {
		nctx = m.MaxContext
	}
	ctx, err := m.NewContext(1, nctx)
	if err != nil {
		return err
	}
	defer ctx.Close()
	var sp C.dsq_sampler_params
	if err := call(func() C.dsq_status {
		return C.dsq_sampler_params_init(&sp, C.uint32_t(unsafe.Sizeof(sp)))
	}); err != nil {
		return err
	}
	if err := call(func() C.dsq_status { return C.dsq_model_sampler_params(m.p, &sp) }); err != nil {
		return err
	}
	if opts.Temperature >= 0 {
		sp.temperature = C.float(opts.Temperature)
	}
	sp.seed = C.uint64_t(opts.Seed)
	var sampler *C.dsq_sampler
	if err := call(func() C.dsq_status { return C.dsq_sampler_new(&sp, &sampler) }); err != nil {
		return err
	}
	defer C.dsq_sampler_free(sampler)
	cstops := make([]*C.char, len(opts.Stop)+1) // +1: never a zero-length slice
	longest := 0
	for i, s := range opts.Stop {
		cstops[i] = C.CString(s)
		defer C.free(unsafe.Pointer(cstops[i]))
		if len(s) > longest {
			longest = len(s)
		}
	}
	// the pointer array is passed to C, so it must live in C memory (cgo rules)
	carr := (**C.char)(C.malloc(C.size_t(len(cstops)) * C.size_t(unsafe.Sizeof(cstops[0]))))
	defer C.free(unsafe.Pointer(carr))
	copy(unsafe.Slice(carr, len(cstops)), cstops)
	var stopper *C.dsq_stopper
	if err := call(func() C.dsq_status {
		return C.dsq_stopper_new(tok.p, carr, C.size_t(len(opts.Stop)), 1, &stopper)
	}); err != nil {
		return err
	}
	defer C.dsq_stopper_free(stopper)
	if err := call(func() C.dsq_status {
		return C.dsq_sampler_accept(sampler, (*C.int32_t)(unsafe.Pointer(&prompt[0])), C.size_t(len(prompt)))
	}); err != nil {
		return err
	}
	logits, err := ctx.Prefill(0, prompt)
	if err != nil {
		return err
	}
	buf := make([]byte, 512+longest)
	left := nctx - len(prompt)
	if left > opts.MaxTokens {
		left = opts.MaxTokens
	}
	for ; left > 0; left-- {
		var id C.int32_t
		if err := call(func() C.dsq_status {
			return C.dsq_sampler_sample(sampler, (*C.float)(unsafe.Pointer(&logits[0])), C.int32_t(m.NVocab), &id)
		}); err != nil {
			return err
		}
		var n C.size_t
		var stopped C.int
		for {
			err := call(func() C.dsq_status {
				return C.dsq_stopper_push(stopper, id, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &n, &stopped)
			})
			if e, ok := err.(*Error); ok && e.Status == int(C.DSQ_ERR_BUFFER_TOO_SMALL) && int(n)+1 > len(buf) {
				buf = make([]byte, int(n)+1)
				continue
			}
			if err != nil {
				return err
			}
			break
		}
		if n > 0 && !emit(string(buf[:int(n)])) {
			return nil
		}
		if stopped != 0 {
			return nil
		}
		if left > 1 {
			if logits, err = ctx.DecodeStep([]int32{0}, []int32{int32(id)}); err != nil {
				return err
			}
		}
	}
	var n C.size_t
	if err := call(func() C.dsq_status {
		return C.dsq_stopper_flush(stopper, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &n)
	}); err != nil {
		return err
	}
	if n > 0 {
		emit(string(buf[:int(n)]))
	}
	return nil
}
