// Package goworker holds what the Go worker declares about itself: its
// fencecheck mapping (docs/worker-contract.md section 14), embedded at build
// so that `fencecheck-go-worker mapping` prints the file kept with the code.
package goworker

import _ "embed"

// Mapping is fencecheck-mapping.yaml as written.
//
//go:embed fencecheck-mapping.yaml
var Mapping []byte
