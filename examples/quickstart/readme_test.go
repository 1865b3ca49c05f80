package main

import (
	"os"
	"strings"
	"testing"
)

// The README's quick start is this program, word for word, so it compiles.
func TestREADMEQuickStartIsThisProgram(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "```go\n"+string(src)+"```") {
		t.Fatal("README.md's quick start differs from examples/quickstart/main.go; copy main.go into the README's Go block")
	}
}
