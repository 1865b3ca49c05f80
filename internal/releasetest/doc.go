// Package releasetest proves that the repository's modules resolve the way
// a user meets them: from a module proxy at a version, without replace
// directives or a workspace. It holds only its test; it is a module of its
// own so that golang.org/x/mod never reaches users.
package releasetest
