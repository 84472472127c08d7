package tollgate_test

// The behaviour table every Tollgate client replays against the real server
// (clients/cases/behaviour.json; the Rust and Python suites replay the same table, so the
// clients agree).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	tollgate "github.com/tollgate-rs/tollgate/clients/go"
	"github.com/tollgate-rs/tollgate/clients/go/internal/testserver"
)

type caseStep struct {
	Try      *float64 `json:"try"`
	Acquire  *float64 `json:"acquire"`
	Class    string   `json:"class"`
	Group    *string  `json:"group"`
	Expect   string   `json:"expect"`
	Field    string   `json:"field"`
	Repeat   int      `json:"repeat"`
	Admitted int      `json:"admitted"`
	Settle   *int     `json:"settle"`
	Actual   float64  `json:"actual"`
	Drop     *int     `json:"drop"`
	Release  *int     `json:"release"`
}

type behaviourCase struct {
	Name     string          `json:"name"`
	Settings json.RawMessage `json:"settings"`
	Steps    []caseStep      `json:"steps"`
}

var classes = map[string]tollgate.Class{"": tollgate.Normal, "normal": tollgate.Normal, "critical": tollgate.Critical, "sheddable": tollgate.Sheddable}

func TestTheLimiterBehavesAsTheSharedTableSays(t *testing.T) {
	text, err := os.ReadFile("../cases/behaviour.json")
	if err != nil {
		t.Fatal(err)
	}
	var table struct{ Cases []behaviourCase }
	if err := json.Unmarshal(text, &table); err != nil {
		t.Fatal(err)
	}
	if len(table.Cases) == 0 {
		t.Fatal("no cases in the table")
	}
	server := testserver.Run(t, t.TempDir(), "--tick-ms", "100", "--lease-ms", "1000")
	for i, c := range table.Cases {
		i, c := i, c
		t.Run(c.Name, func(t *testing.T) {
			group := fmt.Sprintf("case-%d", i)
			if c.Settings != nil {
				req, _ := http.NewRequest("PUT", "http://"+server.HTTP+"/v1/groups/"+group, bytes.NewReader(c.Settings))
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				res.Body.Close()
				if res.StatusCode/100 != 2 {
					t.Fatalf("PUT %s: %s", group, res.Status)
				}
			}
			l := limiter(t, server.Conn, tollgate.Options{ClientID: fmt.Sprintf("go-case-%d", i)})
			replay(t, l, group, c)
		})
	}
}

func replay(t *testing.T, l *tollgate.Limiter, group string, c behaviourCase) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first, err := l.Acquire(ctx, group, 0)
	if err != nil {
		t.Fatal(err)
	}
	first.Release()
	permits := map[int]*tollgate.Permit{}
	for i, step := range c.Steps {
		err = nil
		switch {
		case step.Settle != nil:
			err = permits[*step.Settle].Settle(step.Actual)
		case step.Drop != nil:
			err = permits[*step.Drop].Dropped()
		case step.Release != nil:
			permits[*step.Release].Release()
		}
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		target, class := group, classes[step.Class]
		if step.Group != nil {
			target = *step.Group
		}
		var permit *tollgate.Permit
		switch {
		case step.Repeat > 0:
			admitted := 0
			for n := 0; n < step.Repeat; n++ {
				if _, err := l.TryAcquireClass(target, *step.Try, class); err == nil {
					admitted++
				}
			}
			if admitted != step.Admitted {
				t.Fatalf("step %d: %d admitted, not %d", i, admitted, step.Admitted)
			}
			continue
		case step.Acquire != nil:
			permit, err = l.AcquireClass(ctx, target, *step.Acquire, class)
		case step.Try != nil:
			permit, err = l.TryAcquireClass(target, *step.Try, class)
		default:
			continue
		}
		var refused *tollgate.ErrThrottled
		var invalid *tollgate.ErrInvalidArgument
		got := "admitted"
		if errors.As(err, &refused) {
			got = "refused"
		} else if errors.As(err, &invalid) {
			got = "invalid"
			if !strings.Contains(invalid.Field, step.Field) {
				t.Fatalf("step %d: %v, not naming %s", i, err, step.Field)
			}
		} else if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got != step.Expect {
			t.Fatalf("step %d: %s, not %s", i, got, step.Expect)
		}
		permits[i] = permit
	}
}
