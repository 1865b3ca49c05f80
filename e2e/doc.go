// Package e2e holds the end-to-end tests of the HTTP unit of work: a chi
// router with txmw.Transactional, driven in process with httpexpect,
// against SQLite and MariaDB. Package e2e/chain is the inbox's chain test
// under SIGKILL (issue 36; docs/inbox.md, "How it is tested").
//
// It is a separate module (with a replace directive pointing at the
// repository root) so that httpexpect and its many dependencies stay out of
// the library's go.mod: users of txoutbox never inherit test-only modules.
// The root Makefile runs `go vet` and `go test -race` in every nested
// module, so these tests run in CI like the others.
package e2e
