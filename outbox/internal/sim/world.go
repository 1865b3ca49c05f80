package sim

import (
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
)

// Options select what a run does beyond its seed.
type Options struct {
	// Trace keeps every line of the run's trace (else only the last
	// lines are kept, for a failure's report).
	Trace bool
	// EngineLogs adds the engines' warnings and errors to the trace.
	EngineLogs bool
	// Faults are the fault classes the run may inject; nil: all of them
	// (FaultClasses).
	Faults Faults
}

// FaultClasses are the classes of faults a run injects: crash (an
// instance stops without Close), close (Close with a cancelled, short or
// long context), freeze (an instance's goroutines stop for up to two
// leases), join (a rolling deploy: an instance with one subscription
// more), outage (a destination answers Unavailable), pause (a
// subscription is paused, then resumed), replay (dead letters are
// replayed), skip (dead events that block keys are skipped), storeerr (a
// store call fails before or after it took effect), slow (store calls
// take up to 200 ms), orphan (events of a type no subscription takes).
var FaultClasses = []string{"crash", "close", "freeze", "join", "outage", "pause", "replay", "skip", "storeerr", "slow", "orphan"}

// Faults is a set of fault classes; nil means every class.
type Faults map[string]bool

func (f Faults) on(class string) bool { return f == nil || f[class] }

// ParseFaults reads a comma-separated list of fault classes ("all" or
// "": every class; "none": no fault).
func ParseFaults(s string) (Faults, error) {
	switch s {
	case "", "all":
		return nil, nil
	case "none":
		return Faults{}, nil
	}
	f := Faults{}
	for _, c := range strings.Split(s, ",") {
		if !slices.Contains(FaultClasses, c) {
			return nil, fmt.Errorf("sim: unknown fault class %q; the classes are %s, or all, or none", c, strings.Join(FaultClasses, ","))
		}
		f[c] = true
	}
	return f, nil
}

// Result is what a run found.
type Result struct {
	Seed       uint64
	Violations []string
	Trace      []string
	// Events committed, instances started.
	Committed, Nodes int
	// Elapsed is the virtual time the run took.
	Elapsed time.Duration
}

// Failed reports whether the run broke a promise.
func (r Result) Failed() bool { return len(r.Violations) > 0 }

// world is one run: the store, the nodes, the workload's record and the
// checks. Every field after mu is guarded by it.
type world struct {
	seed  uint64
	opts  Options
	cfg   outbox.Config
	store *outboxtest.Store
	start time.Time
	specs []spec             // the subscriptions of the run (base set, then extras)
	base  []spec             // what every first-generation node runs
	types []outbox.EventType // the types published
	knobs knobs
	// faultsEnd is closed when the fault phase ends: producers stop.
	faultsEnd chan struct{}
	faultCtx  context.Context // the director's: ends with the fault phase
	bg        sync.WaitGroup  // the director's timers (resumes), waited for by heal

	mu         sync.Mutex
	rng        *rand.Rand // the configuration's draws, at the start
	draws      *stream    // the director's
	tick       int64
	trace      []string
	events     []*event
	byID       map[string]*event
	regAt      map[string]int64 // subscription -> tick its registration was seen committed
	calls      []*call
	inflight   map[string][]*call // subscription+key -> ordered calls running
	nodes      []*node
	violations []string
	skipped    map[string]bool          // event ids given up by SkipDead
	outages    map[string]time.Duration // subscription -> end of its destination's outage
	paused     map[string]bool
	everPaused map[string]bool // every subscription paused in the run (heal resumes them)
	ending     atomic.Bool     // set as closeAll begins: no freeze holds a node from then on
	faultsOff  bool
}

// knobs are the seed's intensities.
type knobs struct {
	failRate    float64 // share of handler calls that fail in some way
	storeErr    float64 // share of store calls failing (half before, half after the effect)
	slowStore   time.Duration
	faultPhase  time.Duration
	txGap       time.Duration
	maxTxEvents int
	keys        int
}

// txState is the state of an event's transaction.
type txState int8

const (
	open txState = iota
	committing
	committed
	rollingBack
	rolledBack
)

var stateNames = [...]string{"is open", "is committing", "committed", "is rolling back", "rolled back"}

type event struct {
	n           int
	tok         string // its producer's node and count: see newEvent
	id          string
	typ         outbox.EventType
	key         string
	state       txState
	commitStart int64
	node        string
}

// call is one handler call of a subscription.
type call struct {
	sub     string
	n       int
	key     string
	node    *node
	attempt int
	start   time.Duration
	ok      bool
	zombie  bool // its node crashed or froze during it
	running bool
}

const traceKeep = 3000

// liveTrace prints the trace as it is written (SIM_LIVE=1), to follow a
// run that does not end.
var liveTrace = os.Getenv("SIM_LIVE") != ""

func (w *world) now() time.Duration { return time.Since(w.start) }

// logf adds a line to the trace.
func (w *world) logf(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.logLocked(format, args...)
}

func (w *world) logLocked(format string, args ...any) {
	line := fmt.Sprintf("%9.3fs ", w.now().Seconds()) + fmt.Sprintf(format, args...)
	w.trace = append(w.trace, line)
	if liveTrace {
		fmt.Fprintln(os.Stderr, line)
	}
	if !w.opts.Trace && len(w.trace) > 2*traceKeep {
		w.trace = slices.Clone(w.trace[len(w.trace)-traceKeep:])
	}
}

// violate records a broken promise.
func (w *world) violate(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.violateLocked(format, args...)
}

func (w *world) violateLocked(format string, args ...any) {
	msg := fmt.Sprintf("at %.3fs: ", w.now().Seconds()) + fmt.Sprintf(format, args...)
	w.violations = append(w.violations, msg)
	w.logLocked("VIOLATION %s", msg)
}

// nextTick returns the next number of the run's logical clock, which
// orders registrations and commits.
func (w *world) nextTick() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.tick++
	return w.tick
}

// intn and friends draw from the director's stream of the seed (the
// configuration and the faults' times): only the director draws from it.
func (w *world) intn(n int) int        { return w.draws.intn(n) }
func (w *world) chance(p float64) bool { return w.draws.chance(p) }
func (w *world) dur(lo, hi time.Duration) time.Duration {
	return w.draws.dur(lo, hi)
}

// stream is a random stream of the seed that one goroutine (or one kind
// of draw) has to itself, so that what one part of the run draws does not
// depend on when another part drew: a node's producer has its own, the
// director its own (store faults are drawn by the call: faultyStore.draw).
type stream struct {
	mu sync.Mutex
	r  *rand.Rand
}

// newStream returns the seed's stream named name.
func newStream(seed uint64, name string) *stream {
	h := fnv.New64a()
	fmt.Fprint(h, name)
	return &stream{r: rand.New(rand.NewPCG(seed, h.Sum64()))}
}

func (s *stream) intn(n int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.r.IntN(n)
}

func (s *stream) chance(p float64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.r.Float64() < p
}

func (s *stream) dur(lo, hi time.Duration) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(s.r.Int64N(int64(hi-lo)))
}

func (s *stream) uint64() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.r.Uint64()
}

// hash is a deterministic number in [0, 1) for the given parts: the
// outcome of a handler call does not depend on when it runs.
func (w *world) hash(parts ...any) float64 {
	h := fnv.New64a()
	fmt.Fprint(h, w.seed)
	for _, p := range parts {
		fmt.Fprint(h, "|", p)
	}
	return float64(h.Sum64()>>11) / (1 << 53)
}

// Run runs the simulation of seed. It must be called inside a
// testing/synctest bubble (synctest.Test), which it leaves with no
// goroutine of its own running.
func Run(seed uint64, opts Options) Result {
	w := newWorld(seed, opts)
	w.logf("seed %d: %d base subscriptions %s; lease %v, poll %v..%v, attempts %d, timeout %v; fail %.2f, store errors %.3f, slow %v; fault phase %v",
		seed, len(w.base), specNames(w.base), w.cfg.Lease, w.cfg.PollInterval, w.cfg.PollMaxInterval, w.cfg.MaxAttempts,
		w.cfg.ListenerTimeout, w.knobs.failRate, w.knobs.storeErr, w.knobs.slowStore, w.knobs.faultPhase)
	w.run()
	elapsed := w.now()
	w.awaitStragglers()
	w.mu.Lock()
	defer w.mu.Unlock()
	ncommitted := 0
	for _, e := range w.events {
		if e.state == committed {
			ncommitted++
		}
	}
	return Result{Seed: seed, Violations: slices.Clone(w.violations), Trace: slices.Clone(w.trace),
		Committed: ncommitted, Nodes: len(w.nodes), Elapsed: elapsed}
}

func newWorld(seed uint64, opts Options) *world {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	w := &world{seed: seed, opts: opts, store: outboxtest.NewStore(), start: time.Now(), rng: rng, draws: newStream(seed, "director"),
		byID: map[string]*event{}, regAt: map[string]int64{}, inflight: map[string][]*call{}, skipped: map[string]bool{},
		outages: map[string]time.Duration{}, paused: map[string]bool{}, everPaused: map[string]bool{}, faultsEnd: make(chan struct{})}
	w.cfg = outbox.Config{
		Workers:             1 + rng.IntN(4),
		HotQueueSize:        []int{2, 8, 64}[rng.IntN(3)],
		ColdQueueSize:       []int{4, 16, 64}[rng.IntN(3)],
		PollInterval:        time.Duration(100+rng.IntN(900)) * time.Millisecond,
		PollBatchSize:       []int{1, 5, 50}[rng.IntN(3)],
		SkipRecent:          []time.Duration{-1, 200 * time.Millisecond, time.Second}[rng.IntN(3)],
		Lease:               time.Duration(2+rng.IntN(8)) * time.Second,
		ListenerTimeout:     time.Duration(300+rng.IntN(1200)) * time.Millisecond,
		MaxAttempts:         2 + rng.IntN(4),
		Retry:               retryPolicy{base: 50 * time.Millisecond, max: time.Second},
		CompletionBatchSize: []int{1, 10, 100}[rng.IntN(3)],
		CompletionLinger:    []time.Duration{-1, 10 * time.Millisecond, 100 * time.Millisecond}[rng.IntN(3)],
		StatsInterval:       -1,
		NoListenerDelay:     time.Duration(200+rng.IntN(2000)) * time.Millisecond,
	}
	w.cfg.PollMaxInterval = w.cfg.PollInterval * time.Duration(1+rng.IntN(8))
	w.knobs = knobs{
		failRate:    []float64{0, 0.05, 0.2, 0.4}[rng.IntN(4)],
		storeErr:    []float64{0, 0, 0.01, 0.05}[rng.IntN(4)],
		slowStore:   []time.Duration{0, time.Millisecond, 20 * time.Millisecond, 200 * time.Millisecond}[rng.IntN(4)],
		faultPhase:  time.Duration(5+rng.IntN(25)) * time.Second,
		txGap:       time.Duration(20+rng.IntN(400)) * time.Millisecond,
		maxTxEvents: 1 + rng.IntN(5),
		keys:        1 + rng.IntN(6),
	}
	if !opts.Faults.on("storeerr") {
		w.knobs.storeErr = 0
	}
	if !opts.Faults.on("slow") {
		w.knobs.slowStore = 0
	}
	w.base = pickSpecs(rng)
	w.specs = slices.Clone(w.base)
	for _, t := range eventTypes {
		taken := false
		for _, sp := range w.base {
			taken = taken || sp.takes(t)
		}
		if taken || opts.Faults.on("orphan") {
			w.types = append(w.types, t)
		}
	}
	if opts.EngineLogs {
		w.cfg.Logger = slog.New(slog.NewTextHandler(traceWriter{w}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	} else {
		w.cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return w
}

type traceWriter struct{ w *world }

func (t traceWriter) Write(p []byte) (int, error) {
	t.w.logf("log: %s", strings.TrimSpace(string(p)))
	return len(p), nil
}

// retryPolicy is an exponential back-off without jitter: the same seed
// retries at the same times.
type retryPolicy struct{ base, max time.Duration }

func (r retryPolicy) Delay(failures int) time.Duration {
	d := r.base
	for i := 1; i < failures && d < r.max; i++ {
		d *= 2
	}
	return min(d, r.max)
}

// Bound is the longest an owed delivery may take, once faults stop, to be
// done or dead: its events' leases run out (2 leases: one that a frozen
// or crashed instance held, one for a claim cut short), the poller comes
// round (PollMaxInterval) and each attempt of the events before it in its
// key, and its own, fails after at most ListenerTimeout and waits the
// longest retry delay and a poll; a circuit opened by an outage probes
// again within circuitMaxProbe; an event handed back by an instance
// without the subscription waits NoListenerDelay. keyLen is the most
// events of one ordering key.
func Bound(cfg outbox.Config, retryMax time.Duration, keyLen int) time.Duration {
	perAttempt := cfg.ListenerTimeout + retryMax + cfg.PollMaxInterval + time.Second
	perEvent := time.Duration(cfg.MaxAttempts) * perAttempt
	return 2*cfg.Lease + cfg.PollMaxInterval + cfg.NoListenerDelay + circuitMaxProbe + time.Duration(max(1, keyLen))*perEvent
}

// run is the whole simulation: start the nodes, run the workload and the
// faults, stop the faults, wait for the bound, check, close.
func (w *world) run() {
	n := 2 + w.intn(4)
	for range n {
		w.startNode(w.base, false)
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { w.direct(ctx) })
	for _, nd := range w.liveNodes() {
		nd.produce(&wg)
	}
	time.Sleep(w.knobs.faultPhase)
	stop()
	close(w.faultsEnd)
	w.mu.Lock()
	w.faultsOff = true
	w.mu.Unlock()
	wg.Wait()
	w.heal()
	w.logf("faults stop")
	w.settle()
	w.closeAll()
}

func (w *world) liveNodes() []*node {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []*node
	for _, nd := range w.nodes {
		if nd.alive() {
			out = append(out, nd)
		}
	}
	return out
}
