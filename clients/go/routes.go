package tollgate

import (
	"context"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	pb "github.com/tollgate-rs/tollgate/clients/go/tollgatev1"
)

// Groups sharded over controllers (`tollgate server --shards`): each group's part of an
// exchange goes straight to the controller that grants for it, as the Rust and Python clients
// send it.
//
// An exchange carries the epoch of the shard map the client holds; a controller that applied
// a newer one answers with it, and every grant a sharded controller gives names its group's
// shard. An exchange whose groups all have a known owner is split here and each part sent to
// its owner; one naming a group not known yet goes whole to the controller the client was
// given, which splits it. Owners take a repeated number as a client's restart, so an exchange
// numbered n goes out as 2n and a part resent (through that controller, after its owner did
// not answer) as 2n + 1; the map is then dropped, and the next exchanges go whole (8, doubling
// to 1,024, until a part reaches its owner again).

const (
	// The most groups whose shard a client keeps; past it the table starts again.
	routedGroupsMax = 100000
	// The most shards and controllers a map may name (a map past them is ignored).
	shardsMax, membersMax = 4096, 256
	pauseMin, pauseMax    = 8, 1024
)

// routes are the shard map a limiter holds, the shard of each of its groups, and its
// connections to the owners.
type routes struct {
	mu                sync.Mutex
	epoch             uint64
	members           []string
	owners            []uint32
	shards            map[string]uint32
	paused, nextPause int
	dial              []grpc.DialOption
	conns             map[string]*grpc.ClientConn
}

func newRoutes(dial []grpc.DialOption) *routes {
	if len(dial) == 0 {
		dial = []grpc.DialOption{grpc.WithInsecure()}
	}
	return &routes{shards: map[string]uint32{}, dial: dial, conns: map[string]*grpc.ClientConn{}}
}

// prepare numbers request for routing and names the epoch of the map held.
func (r *routes) prepare(request *pb.ExchangeRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	request.Sequence *= 2
	epoch := r.epoch
	request.ShardMapEpoch = &epoch
}

// learn takes a newer map (a malformed one is ignored) and each granted group's shard.
func (r *routes) learn(answer *pb.ExchangeResponse) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m := answer.GetShardMap(); m != nil && m.GetEpoch() > r.epoch && wellFormed(m) {
		r.epoch, r.members, r.owners = m.GetEpoch(), m.GetMembers(), m.GetOwners()
	}
	for _, g := range answer.GetGrants() {
		if g.Shard == nil {
			continue
		}
		if _, known := r.shards[g.GetGroup()]; !known && len(r.shards) >= routedGroupsMax {
			r.shards = map[string]uint32{}
		}
		r.shards[g.GetGroup()] = g.GetShard()
	}
}

func wellFormed(m *pb.ShardMap) bool {
	if m.GetShards() < 1 || m.GetShards() > shardsMax || len(m.GetOwners()) != int(m.GetShards()) || len(m.GetMembers()) > membersMax {
		return false
	}
	for _, o := range m.GetOwners() {
		if int(o) > len(m.GetMembers()) {
			return false
		}
	}
	return true
}

// forgetMap drops the map (the next answer brings the current one) and pauses the routing.
func (r *routes) forgetMap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.epoch, r.members, r.owners = 0, nil, nil
	r.paused = r.nextPause
	if r.paused < pauseMin {
		r.paused = pauseMin
	}
	r.nextPause = r.paused * 2
	if r.nextPause > pauseMax {
		r.nextPause = pauseMax
	}
}

// reached says every part reached its owner: the next failure pauses the routing the least.
func (r *routes) reached() {
	r.mu.Lock()
	r.nextPause = 0
	r.mu.Unlock()
}

// split is request's parts by owner's address; nil when some group's owner is not known (or
// the routing is paused): the request then goes whole.
func (r *routes) split(request *pb.ExchangeRequest) map[string]*pb.ExchangeRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.paused > 0 {
		r.paused--
		return nil
	}
	if len(r.owners) == 0 || len(request.GetGroups()) == 0 {
		return nil
	}
	parts := map[string]*pb.ExchangeRequest{}
	for _, g := range request.GetGroups() {
		shard, known := r.shards[g.GetGroup()]
		if !known || int(shard) >= len(r.owners) || r.owners[shard] == 0 {
			return nil
		}
		owner := r.members[r.owners[shard]-1]
		part := parts[owner]
		if part == nil {
			part = partOf(request)
			parts[owner] = part
		}
		part.Groups = append(part.Groups, g)
	}
	return parts
}

// partOf is request with no groups: its client's id, number, flags and map epoch.
func partOf(request *pb.ExchangeRequest) *pb.ExchangeRequest {
	return &pb.ExchangeRequest{
		ClientId: request.GetClientId(), Sequence: request.GetSequence(),
		TargetRequestPeriodMs: request.GetTargetRequestPeriodMs(), ShardMapEpoch: request.ShardMapEpoch,
		TakesAllotments: request.GetTakesAllotments(),
	}
}

// owner is the stub for the owner at address, its connection opened on first use.
func (r *routes) owner(address string) (pb.AdmissionClient, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	conn := r.conns[address]
	if conn == nil {
		if len(r.conns) >= membersMax {
			r.closeLocked()
		}
		target := strings.TrimPrefix(strings.TrimPrefix(address, "http://"), "https://")
		var err error
		if conn, err = grpc.Dial(strings.TrimSuffix(target, "/"), r.dial...); err != nil {
			return nil, err
		}
		r.conns[address] = conn
	}
	return pb.NewAdmissionClient(conn), nil
}

func (r *routes) close() {
	r.mu.Lock()
	r.closeLocked()
	r.mu.Unlock()
}

func (r *routes) closeLocked() {
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.conns = map[string]*grpc.ClientConn{}
}

// exchange is one exchange: each group's part to its owner when the map says, else whole
// through home (the controller talked to now). It fails when no part is answered.
func (r *routes) exchange(ctx context.Context, home pb.AdmissionClient, request *pb.ExchangeRequest) (*pb.ExchangeResponse, error) {
	r.prepare(request)
	parts := r.split(request)
	if parts == nil {
		answer, err := home.Exchange(ctx, request)
		if err == nil {
			r.learn(answer)
		}
		return answer, err
	}
	type result struct {
		part   *pb.ExchangeRequest
		answer *pb.ExchangeResponse
		err    error
	}
	results := make(chan result, len(parts))
	for address, part := range parts {
		go func(address string, part *pb.ExchangeRequest) {
			stub, err := r.owner(address)
			if err != nil {
				results <- result{part, nil, err}
				return
			}
			answer, err := stub.Exchange(ctx, part)
			results <- result{part, answer, err}
		}(address, part)
	}
	var answers []*pb.ExchangeResponse
	var again []*pb.GroupUsage
	var failure error
	for range parts {
		res := <-results
		if res.err != nil {
			again, failure = append(again, res.part.GetGroups()...), res.err
			continue
		}
		answers = append(answers, res.answer)
	}
	if len(again) == 0 {
		r.reached()
	} else {
		// The parts whose owners did not answer, again through the controller given.
		r.forgetMap()
		retry := partOf(request)
		retry.Sequence++
		none := uint64(0)
		retry.ShardMapEpoch, retry.Groups = &none, again
		if answer, err := home.Exchange(ctx, retry); err == nil {
			answers = append(answers, answer)
		} else {
			failure = err
		}
	}
	for _, a := range answers {
		r.learn(a)
	}
	if len(answers) == 0 {
		return nil, failure
	}
	return join(answers), nil
}

// join is one answer from the owners' answers: every grant, the earliest next exchange and
// tick, unthrottled work only if every owner allows it, the newest map.
func join(answers []*pb.ExchangeResponse) *pb.ExchangeResponse {
	joined := proto.Clone(answers[0]).(*pb.ExchangeResponse)
	for _, a := range answers[1:] {
		joined.Grants = append(joined.Grants, a.GetGrants()...)
		if a.GetNextExchangeMs() < joined.GetNextExchangeMs() {
			joined.NextExchangeMs = a.GetNextExchangeMs()
		}
		if a.GetNextTickMs() < joined.GetNextTickMs() {
			joined.NextTickMs = a.GetNextTickMs()
		}
		joined.UnthrottledAllowed = joined.GetUnthrottledAllowed() && a.GetUnthrottledAllowed()
		if m := a.GetShardMap(); m != nil && m.GetEpoch() > joined.GetShardMap().GetEpoch() {
			joined.ShardMap = m
		}
	}
	return joined
}
