// Package dsqwen is a small cgo wrapper over libdsqwen's C API: load a
// model, create a context, prefill and decode.  Handles are freed with
// Close(); close every Context before its Model.
//
// Build flags come from pkg-config (`pkg-config --cflags --libs dsqwen`), so
// PKG_CONFIG_PATH must reach dsqwen.pc for a library installed off the
// default search path.
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

// Model is loaded weights (dsq_model); safe for concurrent use.
type Model struct {
	p        *C.dsq_model
	NVocab   int   // logits width
	BOSToken int32 // -1 if the config has none
	EOSToken int32 // -1 if the config has none
}

// Load reads a model directory (config.json + safetensors).
func Load(path string, backend Backend) (*Model, error) {
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
	params.backend = C.int32_t(backend)
	m := &Model{}
	if err := call(func() C.dsq_status { return C.dsq_model_load(cpath, &params, &m.p) }); err != nil {
		return nil, err
	}
	var info C.dsq_model_info
	info.struct_size = C.uint32_t(unsafe.Sizeof(info))
	if err := call(func() C.dsq_status { return C.dsq_model_get_info(m.p, &info) }); err != nil {
		m.Close()
		return nil, err
	}
	m.NVocab, m.BOSToken, m.EOSToken = int(info.n_vocab), int32(info.bos_token), int32(info.eos_token)
	return m, nil
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
