// Greedy decoding through the Go bindings: prefill the given token ids, then
// feed back the argmax for a few steps and print the ids.
//
//	go run . [-backend cpu] [-steps 8] MODEL_DIR ID [ID...]
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"example.com/dsqwen"
)

func run(dir string, backend dsqwen.Backend, steps int, prompt []int32) ([]int32, error) {
	model, err := dsqwen.Load(dir, backend)
	if err != nil {
		return nil, err
	}
	defer model.Close()
	ctx, err := model.NewContext(1, len(prompt)+steps)
	if err != nil {
		return nil, err
	}
	defer ctx.Close() // runs before model.Close()
	logits, err := ctx.Prefill(0, prompt)
	if err != nil {
		return nil, err
	}
	out := make([]int32, 0, steps)
	for len(out) < steps {
		next := int32(dsqwen.Argmax(logits))
		out = append(out, next)
		if len(out) < steps {
			if logits, err = ctx.DecodeStep([]int32{0}, []int32{next}); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

func main() {
	backendName := flag.String("backend", "auto", "auto, cpu or cuda")
	steps := flag.Int("steps", 8, "tokens to generate")
	flag.Parse()
	backends := map[string]dsqwen.Backend{"auto": dsqwen.BackendAuto, "cpu": dsqwen.BackendCPU,
		"cuda": dsqwen.BackendCUDA}
	backend, ok := backends[*backendName]
	if !ok || flag.NArg() < 2 || *steps < 1 {
		fmt.Fprintln(os.Stderr, "usage: dsqwen-go [-backend auto|cpu|cuda] [-steps N] MODEL_DIR ID [ID...]")
		os.Exit(2)
	}
	var prompt []int32
	for _, a := range flag.Args()[1:] {
		id, err := strconv.ParseInt(a, 10, 32)
		if err != nil {
			fmt.Fprintln(os.Stderr, "dsqwen-go: bad token id:", a)
			os.Exit(2)
		}
		prompt = append(prompt, int32(id))
	}
	out, err := run(flag.Arg(0), backend, *steps, prompt)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dsqwen-go:", err)
		os.Exit(1)
	}
	ids := make([]string, len(out))
	for i, t := range out {
		ids[i] = strconv.Itoa(int(t))
	}
	fmt.Printf("libdsqwen %s: prompt %d tokens; argmax ids: %s\n", dsqwen.Version(), len(prompt),
		strings.Join(ids, " "))
}
