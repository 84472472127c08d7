package tollgate

import "math"

// Class is a request's class within its group (Google's criticality): critical work may
// empty the group's bucket, normal work leaves the group's critical_reserve share of its
// burst, sheddable work leaves half of the rest too, and is refused first.
type Class int

const (
	// Normal is the default class.
	Normal Class = iota
	// Critical work may take the whole bucket.
	Critical
	// Sheddable work is refused first.
	Sheddable
)

func (c Class) String() string {
	switch c {
	case Critical:
		return "critical"
	case Sheddable:
		return "sheddable"
	default:
		return "normal"
	}
}

// floor is the share of a bucket's burst a request of class c must leave in it, as the Rust
// and Python clients compute it.
func (c Class) floor(criticalReserve float64) float64 {
	reserve := math.Min(math.Max(criticalReserve, 0), 0.9)
	switch c {
	case Critical:
		return 0
	case Sheddable:
		return reserve + (1-reserve)/2
	default:
		return reserve
	}
}

func checkClass(c Class) error {
	if c < Normal || c > Sheddable {
		return &ErrInvalidArgument{"class", "must be Normal, Critical or Sheddable"}
	}
	return nil
}
