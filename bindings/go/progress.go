package dsqwen

// The load-progress callback: C calls the exported dsqGoProgress, which
// finds the Go function through a cgo.Handle.  The user pointer points at a
// C-allocated cell holding the handle: the params struct is Go memory and
// may not hold a Go pointer, and an integer disguised as a pointer would
// upset the garbage collector.  A file with //export may hold only C
// declarations in its preamble, so this lives apart from dsqwen.go.

/*
#include <stdlib.h>
#include "dsqwen.h"
int dsqGoProgress(float fraction, void *user);
*/
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

type progressState struct {
	fn       func(float32) bool
	panicked bool
	panicVal any
}

//export dsqGoProgress
func dsqGoProgress(fraction C.float, user unsafe.Pointer) (ret C.int) {
	p := cgo.Handle(*(*C.uintptr_t)(user)).Value().(*progressState)
	if p.panicked {
		return 1
	}
	// a panic must not unwind through the library's C frames: keep it,
	// cancel the load, and re-panic once dsq_model_load has returned
	defer func() {
		if r := recover(); r != nil {
			p.panicked, p.panicVal, ret = true, r, 1
		}
	}()
	if p.fn(float32(fraction)) {
		return 0
	}
	return 1
}

// setProgress makes params report to st through dsqGoProgress; call the
// returned function once the load has returned.
func setProgress(params *C.dsq_model_params, st *progressState) (release func()) {
	h := cgo.NewHandle(st)
	cell := (*C.uintptr_t)(C.malloc(C.sizeof_uintptr_t))
	*cell = C.uintptr_t(h)
	params.progress = C.dsq_progress_fn(C.dsqGoProgress)
	params.progress_user = unsafe.Pointer(cell)
	return func() {
		C.free(unsafe.Pointer(cell))
		h.Delete()
	}
}
