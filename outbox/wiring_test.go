package outbox

import (
	"reflect"
	"slices"
	"testing"
)

// The engine's parts form a pipeline (docs/design/engine.md): the feeders
// (the poller, which asks the sequencer to sweep; the sequencer) → the
// dispatcher → the completer. A part may hold the parts downstream of it
// and the side services, which are fed by none (registrar, lease keeper,
// signals); never a part upstream of it, nor state that such a part
// owns. Feedback goes through channels the upstream part owns and reads
// (signals).
//
// TestPipelineHasNoBackEdges reads the parts' fields and fails on an edge
// back upstream that is not in knownBackEdges (issue 34 is to remove
// those), and on an entry of knownBackEdges the code no longer has, so
// that the list shrinks with the code.
func TestPipelineHasNoBackEdges(t *testing.T) {
	rank := map[reflect.Type]int{
		reflect.TypeFor[poller]():     0,
		reflect.TypeFor[sequencer]():  1,
		reflect.TypeFor[dispatcher](): 2,
		reflect.TypeFor[completer]():  3,
	}
	// State a part owns, held by pointer elsewhere.
	owner := map[reflect.Type]reflect.Type{
		reflect.TypeFor[keyTable]():    reflect.TypeFor[dispatcher](),
		reflect.TypeFor[inflightSet](): reflect.TypeFor[leaseKeeper](),
	}
	var knownBackEdges []string
	var found, forward []string
	for from, r := range rank {
		for i := range from.NumField() {
			f := from.Field(i)
			for _, to := range targets(f.Type, rank, owner) {
				if to == from {
					continue
				}
				e := from.Name() + "." + f.Name + " -> " + to.Name()
				if tr, ok := rank[to]; ok && tr < r {
					found = append(found, e)
				} else {
					forward = append(forward, e)
				}
			}
		}
	}
	slices.Sort(found)
	slices.Sort(knownBackEdges)
	for _, e := range found {
		if !slices.Contains(knownBackEdges, e) {
			t.Errorf("%s: a part holds one upstream of it (or state it owns); feed back through a channel the upstream part reads (signals.go)", e)
		}
	}
	for _, e := range knownBackEdges {
		if !slices.Contains(found, e) {
			t.Errorf("%s is gone: take it off knownBackEdges (and docs/design/engine.md's list)", e)
		}
	}
	// The reader sees the fields: it finds the edges the pipeline has.
	for _, e := range []string{"sequencer.disp -> dispatcher", "dispatcher.comp -> completer"} {
		if !slices.Contains(forward, e) {
			t.Errorf("edge %s not found (found %v): the test no longer reads the parts' fields", e, forward)
		}
	}
}

// targets returns the parts a field of type ft reaches: a part held by
// pointer or value, the owner of state held, a part implementing an
// interface held.
func targets(ft reflect.Type, rank map[reflect.Type]int, owner map[reflect.Type]reflect.Type) []reflect.Type {
	if ft.Kind() == reflect.Pointer {
		ft = ft.Elem()
	}
	if _, ok := rank[ft]; ok {
		return []reflect.Type{ft}
	}
	if o, ok := owner[ft]; ok {
		return []reflect.Type{o}
	}
	var out []reflect.Type
	if ft.Kind() == reflect.Interface {
		for p := range rank {
			if reflect.PointerTo(p).Implements(ft) {
				out = append(out, p)
			}
		}
		for _, o := range owner {
			if reflect.PointerTo(o).Implements(ft) && !slices.Contains(out, o) {
				out = append(out, o)
			}
		}
	}
	return out
}
