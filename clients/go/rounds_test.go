package tollgate_test

// The exchange's rounds against the real server: more groups than one exchange carries go in
// pages, and a group idle past the expiry leaves the exchanges until it is asked for again.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	tollgate "github.com/tollgate-rs/tollgate/clients/go"
	"github.com/tollgate-rs/tollgate/clients/go/internal/testserver"
)

func TestMoreGroupsThanAnExchangeCarriesAreReportedInPages(t *testing.T) {
	conn := testserver.Start(t)
	l := limiter(t, conn, tollgate.Options{})
	const groups = 2*tollgate.ExchangeGroupsMax + 500
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	names := make([]string, groups)
	for i := range names {
		names[i] = fmt.Sprintf("tenant-%d", i)
		// Each is new: the first try is refused until its grant comes.
		_, _ = l.TryAcquire(names[i], 1)
	}
	for _, name := range names {
		if _, err := l.Acquire(ctx, name, 1); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !tollgate.Granted(l, name) {
			t.Fatalf("%s admitted without a grant", name)
		}
	}
	// Every round now carries all of them, in pages: each admission reaches the server.
	for _, name := range names {
		if _, err := l.TryAcquire(name, 1); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	testserver.Eventually(t, "every admission reported", func() (bool, string) {
		admitted, reported := uint64(0), 0
		for _, g := range testserver.Groups(t, conn) {
			if strings.HasPrefix(g.GetName(), "tenant-") {
				admitted += g.GetAdmittedTotal()
				reported++
			}
		}
		return reported == groups && admitted == 2*groups,
			fmt.Sprintf("the server saw %d admissions in %d groups, not %d in %d", admitted, reported, 2*groups, groups)
	})
}

func TestAGroupIdlePastTheExpiryTakesAFreshGrant(t *testing.T) {
	conn := testserver.Start(t)
	create(t, conn, "quiet", 100, 0)
	l := limiter(t, conn, tollgate.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := l.Acquire(ctx, "quiet", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "busy", 1); err != nil {
		t.Fatal(err)
	}
	// Four minutes pass with nothing asked of "quiet", while "busy" keeps working.
	tollgate.Skip(l, time.Duration(tollgate.GroupIdleExpiry*float64(time.Second))+time.Second)
	testserver.Eventually(t, "the idle group left out", func() (bool, string) {
		if _, err := l.TryAcquire("busy", 1); err != nil {
			t.Fatal("busy was refused:", err)
		}
		return !tollgate.Granted(l, "quiet"), "quiet still granted"
	})
	if !tollgate.Granted(l, "busy") {
		t.Fatal("the busy group lost its grant")
	}
	// Asked for again, it is served within one exchange.
	if _, err := l.Acquire(ctx, "quiet", 1); err != nil {
		t.Fatal(err)
	}
	if !tollgate.Granted(l, "quiet") {
		t.Fatal("admitted without a grant")
	}
}
