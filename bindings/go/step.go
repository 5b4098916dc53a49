package dsqwen

/*
#include <stdlib.h>
#include <string.h>
#include "dsqwen.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// SampleParams are the settings dsq_step() samples with (dsq_sample_params).
type SampleParams struct {
	Temperature       float32 // 0: greedy
	TopK              int32   // 0: off
	TopP              float32 // 1: off
	MinP              float32 // 0: off
	RepetitionPenalty float32 // 1: off
	PresencePenalty   float32 // 0: off
	FrequencyPenalty  float32 // 0: off
	PenaltyLastN      int32
	Seed              uint64
	NVocabValid       int32 // 0: the model's tokenizer size, else all
}

// DefaultSampleParams returns the library's defaults.
func DefaultSampleParams() (SampleParams, error) {
	var p C.dsq_sample_params
	if err := call(func() C.dsq_status {
		return C.dsq_sample_params_init(&p, C.uint32_t(unsafe.Sizeof(p)))
	}); err != nil {
		return SampleParams{}, err
	}
	return SampleParams{float32(p.temperature), int32(p.top_k), float32(p.top_p), float32(p.min_p),
		float32(p.repetition_penalty), float32(p.presence_penalty), float32(p.frequency_penalty),
		int32(p.penalty_last_n), uint64(p.seed), int32(p.n_vocab_valid)}, nil
}

// StepSample appends tokens to sequence seq in one dsq_step() and draws
// the next token inside the library (on the GPU with the CUDA backend).
// It returns the id and its log-probability under the model (before
// penalties and temperature); ok is false when the logits held no finite
// value.
func (c *Context) StepSample(seq int32, tokens []int32, sp SampleParams) (id int32, logprob float32, ok bool, err error) {
	if len(tokens) == 0 {
		return 0, 0, false, fmt.Errorf("dsqwen: StepSample needs tokens")
	}
	// the entry points at the tokens and the sampler settings, so all of
	// it lives in C memory (cgo: C may not be given Go memory holding Go
	// pointers)
	type block struct {
		entry  C.dsq_step_seq
		sample C.dsq_sample_params
		out    C.dsq_step_out
	}
	b := (*block)(C.calloc(1, C.size_t(unsafe.Sizeof(block{}))))
	defer C.free(unsafe.Pointer(b))
	toks := (*C.int32_t)(C.malloc(C.size_t(4 * len(tokens))))
	defer C.free(unsafe.Pointer(toks))
	copy(unsafe.Slice((*int32)(unsafe.Pointer(toks)), len(tokens)), tokens)
	if err := call(func() C.dsq_status {
		return C.dsq_sample_params_init(&b.sample, C.uint32_t(unsafe.Sizeof(b.sample)))
	}); err != nil {
		return 0, 0, false, err
	}
	s := &b.sample
	s.temperature, s.top_k, s.top_p, s.min_p = C.float(sp.Temperature), C.int32_t(sp.TopK), C.float(sp.TopP), C.float(sp.MinP)
	s.repetition_penalty, s.presence_penalty = C.float(sp.RepetitionPenalty), C.float(sp.PresencePenalty)
	s.frequency_penalty, s.penalty_last_n = C.float(sp.FrequencyPenalty), C.int32_t(sp.PenaltyLastN)
	s.seed, s.n_vocab_valid = C.uint64_t(sp.Seed), C.int32_t(sp.NVocabValid)
	b.entry.seq, b.entry.n_tokens, b.entry.tokens = C.int32_t(seq), C.int32_t(len(tokens)), toks
	b.entry.sample, b.entry.flags = s, C.DSQ_STEP_LOGPROB
	if err := call(func() C.dsq_status { return C.dsq_step(c.p, &b.entry, 1, nil, &b.out) }); err != nil {
		return 0, 0, false, err
	}
	if b.out.token < 0 {
		return 0, 0, false, nil
	}
	return int32(b.out.token), float32(b.out.logprob), true, nil
}

// Synchronize waits for the context's queued GPU work (a no-op on the CPU
// backend).
func (c *Context) Synchronize() error {
	return call(func() C.dsq_status { return C.dsq_ctx_synchronize(c.p) })
}

// CUDAStream is the context's cudaStream_t, or nil on the CPU backend.  The
// library owns it; it lives as long as the context.
func (c *Context) CUDAStream() (unsafe.Pointer, error) {
	var s unsafe.Pointer
	err := call(func() C.dsq_status {
		st := C.dsq_ctx_cuda_stream(c.p, &s)
		if st == C.DSQ_ERR_UNSUPPORTED {
			return C.DSQ_OK // the CPU backend: no stream, not an error
		}
		return st
	})
	return s, err
}

// Fork starts (empty) sequence dst as a copy of sequence src.
func (c *Context) Fork(src, dst int32) error {
	return call(func() C.dsq_status { return C.dsq_seq_fork(c.p, C.int32_t(src), C.int32_t(dst)) })
}

// Truncate keeps only the first newLen tokens of sequence seq.
func (c *Context) Truncate(seq, newLen int32) error {
	return call(func() C.dsq_status { return C.dsq_seq_truncate(c.p, C.int32_t(seq), C.int32_t(newLen)) })
}

// SeqLength is the number of tokens sequence seq holds.
func (c *Context) SeqLength(seq int32) (int, error) {
	var n C.int32_t
	err := call(func() C.dsq_status { return C.dsq_seq_length(c.p, C.int32_t(seq), &n) })
	return int(n), err
}
