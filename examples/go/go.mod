module example.com/dsqwen-example

go 1.19

require example.com/dsqwen v0.0.0

// the binding from this repository (bindings/go); an application outside
// it points the same replace at its checkout of libdsqwen
replace example.com/dsqwen => ../../bindings/go
