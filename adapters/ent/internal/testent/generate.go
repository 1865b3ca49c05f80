// Package testent is the ent client generated from ./schema for the tests
// and examples of package entoutbox. It is generated with the
// sql/execquery feature, which entoutbox needs; rebuild it with
// go generate after changing the schema.
package testent

//go:generate go run -mod=mod entgo.io/ent/cmd/ent generate --feature sql/execquery ./schema
