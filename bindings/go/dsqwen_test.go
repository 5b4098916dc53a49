package dsqwen

// The Go binding on the tiny reference model (tests/data/tiny: vocabulary
// 1000, no tokenizer; the R1 tokenizer of tests/data/model is loaded
// separately for text: ids below 1000 are ordinary tokens there).  The
// reference values come from Hugging Face transformers (golden.json).

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var data = filepath.Join("..", "..", "tests", "data")

// golden returns the prompt and the reference argmax of its last row.
func golden(t *testing.T) ([]int32, int) {
	raw, err := os.ReadFile(filepath.Join(data, "tiny", "golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Vocab  int     `json:"vocab"`
		Prompt []int32 `json:"prompt"`
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(data, "tiny", "prefill_logits.f32"))
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 4*g.Vocab*len(g.Prompt) {
		t.Fatalf("prefill_logits.f32: %d bytes", len(b))
	}
	last := make([]float32, g.Vocab)
	off := 4 * g.Vocab * (len(g.Prompt) - 1)
	for i := range last {
		last[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[off+4*i:]))
	}
	return g.Prompt, Argmax(last)
}

func load(t *testing.T) *Model {
	m, err := Load(filepath.Join(data, "tiny"), BackendCPU)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestPrefillMatchesReference(t *testing.T) {
	prompt, want := golden(t)
	m := load(t)
	defer m.Close()
	if m.NVocab != 1000 || m.Tokenizer() != nil {
		t.Fatalf("NVocab %d, tokenizer %v", m.NVocab, m.Tokenizer())
	}
	ctx, err := m.NewContext(1, 256)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	logits, err := ctx.Prefill(0, prompt)
	if err != nil {
		t.Fatal(err)
	}
	if got := Argmax(logits); got != want {
		t.Fatalf("argmax %d, reference %d", got, want)
	}
}

func greedy(t *testing.T, m *Model, prompt []int32, n int) []int32 {
	ctx, err := m.NewContext(1, 256)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	logits, err := ctx.Prefill(0, prompt)
	var ids []int32
	for i := 0; err == nil && i < n; i++ {
		ids = append(ids, int32(Argmax(logits)))
		logits, err = ctx.DecodeStep([]int32{0}, ids[len(ids)-1:])
	}
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestGenerateStreamsText(t *testing.T) {
	prompt, want := golden(t)
	m := load(t)
	defer m.Close()
	tok, err := LoadTokenizer(filepath.Join(data, "model", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	var pieces []string
	opts := GenerateOptions{MaxTokens: 10, Temperature: 0}
	if err := m.Generate(tok, prompt, opts, func(s string) bool { pieces = append(pieces, s); return true }); err != nil {
		t.Fatal(err)
	}
	ids := greedy(t, m, prompt, 10)
	if int(ids[0]) != want {
		t.Fatalf("first id %d, reference %d", ids[0], want)
	}
	text, err := tok.Detokenize(ids, true)
	if err != nil {
		t.Fatal(err)
	}
	full := strings.Join(pieces, "")
	if len(pieces) < 2 || full != text {
		t.Fatalf("streamed %q in %d pieces, want %q", full, len(pieces), text)
	}
	// a stop string ends the stream and is not shown
	r := []rune(full)
	stop := string(r[len(r)/2 : len(r)/2+2])
	opts.Stop = []string{stop}
	cut := ""
	if err := m.Generate(tok, prompt, opts, func(s string) bool { cut += s; return true }); err != nil {
		t.Fatal(err)
	}
	if cut != full[:strings.Index(full, stop)] {
		t.Fatalf("with stop %q: %q", stop, cut)
	}
	// round trip through the tokenizer
	hello, err := tok.Tokenize("Hello, wörld", false)
	if err != nil {
		t.Fatal(err)
	}
	if back, _ := tok.Detokenize(hello, false); back != "Hello, wörld" {
		t.Fatalf("round trip gave %q", back)
	}
}

func TestErrorsCarryStatusAndMessage(t *testing.T) {
	_, err := Load("/nonexistent/model", BackendCPU)
	e, ok := err.(*Error)
	if !ok || e.Status != -4 || !strings.Contains(e.Name, "DSQ_ERR_IO") || !strings.Contains(e.Message, "/nonexistent/model") {
		t.Fatalf("got %#v", err)
	}
	m := load(t)
	defer m.Close()
	ctx, err := m.NewContext(1, 64)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	if _, err := ctx.Prefill(0, []int32{5000}); err == nil || err.(*Error).Status != -11 {
		t.Fatalf("token 5000: %v", err)
	}
}

func TestOneModelManyGoroutines(t *testing.T) {
	prompt, want := golden(t)
	m := load(t)
	defer m.Close()
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, err := m.NewContext(1, 128)
			if err != nil {
				errs <- err.Error()
				return
			}
			defer ctx.Close()
			logits, err := ctx.Prefill(0, prompt)
			if err != nil {
				errs <- err.Error()
			} else if got := Argmax(logits); got != want {
				errs <- fmt.Sprintf("argmax %d, reference %d", got, want)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestProgressIsNonDecreasingUpToOne(t *testing.T) {
	var seen []float32
	m, err := LoadWithOptions(filepath.Join(data, "tiny"), LoadOptions{Backend: BackendCPU,
		Progress: func(f float32) bool { seen = append(seen, f); return true }})
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	if len(seen) < 3 || seen[len(seen)-1] != 1 {
		t.Fatalf("fractions %v", seen)
	}
	for i, f := range seen {
		if f < 0 || f > 1 || (i > 0 && f < seen[i-1]) {
			t.Fatalf("fractions %v", seen)
		}
	}
}

func TestProgressCancels(t *testing.T) {
	calls := 0
	_, err := LoadWithOptions(filepath.Join(data, "tiny"), LoadOptions{Backend: BackendCPU,
		Progress: func(f float32) bool { calls++; return f < 0.5 }})
	if e, ok := err.(*Error); !ok || e.Status != StatusCancelled || calls < 2 {
		t.Fatalf("got %v after %d calls", err, calls)
	}
	// a panic cancels the load too and comes back out of LoadWithOptions
	after := 0
	func() {
		defer func() {
			if r := recover(); r != "stop" {
				t.Fatalf("recovered %v", r)
			}
		}()
		LoadWithOptions(filepath.Join(data, "tiny"), LoadOptions{Backend: BackendCPU,
			Progress: func(f float32) bool {
				if f > 0 {
					after++
					panic("stop")
				}
				return true
			}})
		t.Fatal("no panic")
	}()
	if after != 1 {
		t.Fatalf("called %d times after the panic", after)
	}
}

func TestSkipFiniteCheckAndCopyWeights(t *testing.T) {
	dir := t.TempDir()
	st, err := os.ReadFile(filepath.Join(data, "tiny", "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := os.ReadFile(filepath.Join(data, "tiny", "config.json"))
	os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644)
	var hdr map[string]json.RawMessage
	n := binary.LittleEndian.Uint64(st)
	if err := json.Unmarshal(st[8:8+n], &hdr); err != nil {
		t.Fatal(err)
	}
	var ten struct {
		Dtype   string `json:"dtype"`
		Offsets []int  `json:"data_offsets"`
	}
	json.Unmarshal(hdr["model.layers.1.mlp.up_proj.weight"], &ten)
	if ten.Dtype != "BF16" {
		t.Fatalf("dtype %q", ten.Dtype)
	}
	off := 8 + int(n) + ten.Offsets[0]
	st[off], st[off+1] = 0xc0, 0x7f // bf16 NaN
	path := filepath.Join(dir, "model.safetensors")
	os.WriteFile(path, st, 0o644)
	if _, err := Load(dir, BackendCPU); err == nil || err.(*Error).Status != StatusFormat {
		t.Fatalf("NaN weight: %v", err)
	}
	m, err := LoadWithOptions(dir, LoadOptions{Backend: BackendCPU, SkipFiniteCheck: true, CopyWeights: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	// copied: zeroing the file in place changes nothing (mapped, it would
	// turn every logit into 0 instead of NaN)
	f, _ := os.OpenFile(path, os.O_WRONLY, 0)
	f.Write(make([]byte, len(st)))
	f.Close()
	prompt, _ := golden(t)
	ctx, err := m.NewContext(1, 128)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	logits, err := ctx.Prefill(0, prompt)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range logits {
		if !math.IsNaN(float64(x)) {
			t.Fatalf("logit %v: want NaN from the NaN weight", x)
		}
	}
}

func TestFeaturesAndBackends(t *testing.T) {
	words := strings.Fields(BuildFeatures())
	has := func(w string) bool {
		for _, x := range words {
			if x == w {
				return true
			}
		}
		return false
	}
	if !has("cpu") || !BackendAvailable(BackendCPU) || !BackendAvailable(BackendAuto) {
		t.Fatalf("features %q", words)
	}
	if !has("cuda") && BackendAvailable(BackendCUDA) {
		t.Fatal("CUDA available in a build without it")
	}
}

func TestStepForkTruncate(t *testing.T) {
	prompt, want := golden(t)
	m := load(t)
	defer m.Close()
	ctx, err := m.NewContext(2, 256)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	sp, err := DefaultSampleParams()
	if err != nil || sp.Seed == 0 || sp.TopP != 0.95 {
		t.Fatalf("defaults %+v, %v", sp, err)
	}
	sp.Temperature = 0
	id, lp, ok, err := ctx.StepSample(0, prompt, sp)
	if err != nil || !ok || int(id) != want || !(lp < 0) {
		t.Fatalf("StepSample: %d %v %v %v, reference %d", id, lp, ok, err, want)
	}
	if err := ctx.Fork(0, 1); err != nil {
		t.Fatal(err)
	}
	if n, _ := ctx.SeqLength(1); n != len(prompt) {
		t.Fatalf("fork holds %d tokens", n)
	}
	rows, err := ctx.DecodeStep([]int32{0, 1}, []int32{id, id})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < m.NVocab; i++ {
		if rows[i] != rows[m.NVocab+i] {
			t.Fatalf("fork differs at %d", i)
		}
	}
	if err := ctx.Truncate(0, int32(len(prompt)-1)); err != nil {
		t.Fatal(err)
	}
	id2, lp2, _, err := ctx.StepSample(0, prompt[len(prompt)-1:], sp)
	if err != nil || id2 != id || math.Abs(float64(lp2-lp)) > 1e-5 {
		t.Fatalf("after truncate: %d %v %v", id2, lp2, err)
	}
	if e, ok := ctx.Fork(0, 1).(*Error); !ok || e.Status != StatusSeq {
		t.Fatalf("fork onto an active sequence: %v", e)
	}
	// the tests run on the CPU backend: synchronous, no CUDA stream
	if err := ctx.Synchronize(); err != nil {
		t.Fatalf("Synchronize: %v", err)
	}
	if s, err := ctx.CUDAStream(); s != nil || err != nil {
		t.Fatalf("CUDAStream on the CPU backend: %v %v", s, err)
	}
}

func TestQuantizeAtLoadAndSave(t *testing.T) {
	// tests/data/quant_tiny/bf16 quantized to 4 bits (int8 head) at load,
	// saved, loaded again: the same logits, bit for bit
	src := filepath.Join(data, "quant_tiny", "bf16")
	m, err := LoadWithOptions(src, LoadOptions{Backend: BackendCPU, Quantize: QuantizeQ4, QuantizeHead: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	out := t.TempDir()
	if err := m.Save(out); err != nil {
		t.Fatal(err)
	}
	prompt := []int32{5, 17, 300, 42, 7}
	logits := func(m *Model) []float32 {
		c, err := m.NewContext(1, 64)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		l, err := c.Prefill(0, prompt)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	want := logits(m)
	s, err := Load(out, BackendCPU)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := logits(s)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("logit %d: %g after save, %g quantized at load", i, got[i], want[i])
		}
	}
	if _, err := LoadWithOptions(out, LoadOptions{Backend: BackendCPU, Quantize: QuantizeInt8}); err == nil {
		t.Fatal("quantizing a quantized checkpoint again was not refused")
	}
}
