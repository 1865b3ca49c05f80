// Package doctest compiles every Go block of the README and of the guides
// in docs/, so that a snippet a user copies builds against the code it
// describes. It is a module of its own (in go.work) so that it can import
// the connectors and chi without making them dependencies of the library.
//
// A block that is a complete file (its first line of code is a package
// clause) is built as it is. Any other block is a fragment: statements are
// wrapped in a function, declarations are kept at file level, and both
// see the names the guides use without declaring them (ctx, db, ob,
// store, id, body, …; see harnessVars). A block preceded by the line
// <!-- doctest: skip --> is not compiled; keep those rare.
package doctest
