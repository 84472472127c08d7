package tollgate_test

// The cost models replayed from the table the Rust code computes (shared_cases.json's cost
// cases): the Go client prices what the Rust and Python clients price.

import (
	"encoding/json"
	"errors"
	"os"
	"testing"

	tollgate "github.com/tollgate-rs/tollgate/clients/go"
)

func TestEveryCostModelPricesAsTheRustModelsDo(t *testing.T) {
	text, err := os.ReadFile("../python/tests/shared_cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var table struct {
		Cost []struct {
			Model        string             `json:"model"`
			Coefficients map[string]float64 `json:"coefficients"`
			Usage        struct {
				Kind     string   `json:"kind"`
				Bytes    uint64   `json:"bytes"`
				CPUms    float64  `json:"cpu_ms"`
				Replicas uint32   `json:"replicas"`
				Durable  bool     `json:"durable"`
				Units    *float64 `json:"units"`
			} `json:"usage"`
			Cost    float64 `json:"cost"`
			Upfront float64 `json:"upfront"`
		} `json:"cost"`
	}
	if err := json.Unmarshal(text, &table); err != nil {
		t.Fatal(err)
	}
	if len(table.Cost) < 100 {
		t.Fatalf("only %d cost cases", len(table.Cost))
	}
	for i, c := range table.Cost {
		var m tollgate.CostModel
		switch c.Model {
		case "fdb":
			m, err = tollgate.FDB(c.Coefficients["fungibility"])
		case "ru":
			m, err = tollgate.RU(c.Coefficients)
		case "linear":
			m, err = tollgate.Linear(c.Coefficients)
		case "couchbase":
			m = tollgate.Couchbase()
		default:
			m = tollgate.Count()
		}
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		u := tollgate.Usage{Write: c.Usage.Kind == "write", Bytes: c.Usage.Bytes, CPUms: c.Usage.CPUms,
			Replicas: c.Usage.Replicas, Durable: c.Usage.Durable, Units: c.Usage.Units}
		cost, err := m.Cost(u)
		upfront, err2 := m.Upfront(u)
		if err != nil || err2 != nil || !close(cost, c.Cost) || !close(upfront, c.Upfront) {
			t.Errorf("case %d (%s %+v): cost %v upfront %v (%v, %v), the Rust model %v and %v",
				i, c.Model, c.Usage, cost, upfront, err, err2, c.Cost, c.Upfront)
		}
	}
	var bad *tollgate.ErrInvalidArgument
	if _, err := tollgate.RU(map[string]float64{"colour": 1}); err == nil || !errors.As(err, &bad) || bad.Field != "colour" {
		t.Errorf("an unknown coefficient: %v", err)
	}
}
