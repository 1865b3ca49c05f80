package outbox

import (
	"testing"

	"github.com/txoutbox/txoutbox/internal/leakcheck"
)

func leakMain(m *testing.M) { leakcheck.Main(m) }
