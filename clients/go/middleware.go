package tollgate

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// retryAfterSeconds is a Retry-After header's value for a wait: whole seconds, at least 1.
func retryAfterSeconds(wait time.Duration) string {
	return strconv.Itoa(int(math.Max(1, math.Ceil(wait.Seconds()))))
}

// admitWithin admits cost for group, waiting up to maxWait (0: not at all).
func (l *Limiter) admitWithin(ctx context.Context, group string, cost float64, maxWait time.Duration) error {
	var err error
	if maxWait <= 0 {
		_, err = l.TryAcquire(group, cost)
	} else {
		wait, cancel := context.WithTimeout(ctx, maxWait)
		defer cancel()
		_, err = l.Acquire(wait, group, cost)
	}
	return err
}

// Middleware admits each HTTP request for the group groupOf names (its tenant), at a cost of
// one, waiting up to maxWait for it. A refused request is answered 429 with Retry-After (whole
// seconds, at least 1) and a JSON body naming the group; a request whose group breaks the
// naming rules, 400.
func (l *Limiter) Middleware(groupOf func(*http.Request) string, maxWait time.Duration) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			group := groupOf(r)
			err := l.admitWithin(r.Context(), group, 1, maxWait)
			var refused *ErrThrottled
			var bad *ErrInvalidArgument
			switch {
			case err == nil:
				next.ServeHTTP(w, r)
				return
			case errors.As(err, &refused):
				w.Header().Set("Retry-After", retryAfterSeconds(refused.RetryAfter))
				answer(w, http.StatusTooManyRequests, map[string]interface{}{
					"error": "throttled", "group": group, "retry_after_s": refused.RetryAfter.Seconds(),
				})
			case errors.As(err, &bad):
				answer(w, http.StatusBadRequest, map[string]interface{}{"error": "bad tenant", "rule": bad.Rule})
			default:
				answer(w, http.StatusInternalServerError, map[string]interface{}{"error": err.Error()})
			}
		})
	}
}

func answer(w http.ResponseWriter, code int, body map[string]interface{}) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}

// UnaryServerInterceptor admits each unary gRPC call for the group groupOf names, at a cost
// of one, waiting up to maxWait for it. A refused call fails with RESOURCE_EXHAUSTED and a
// retry-after header (whole seconds, at least 1); a call whose group breaks the naming rules,
// with INVALID_ARGUMENT.
func (l *Limiter) UnaryServerInterceptor(groupOf func(ctx context.Context, method string) string, maxWait time.Duration) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req interface{}, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (interface{}, error) {
		group := groupOf(ctx, info.FullMethod)
		err := l.admitWithin(ctx, group, 1, maxWait)
		var refused *ErrThrottled
		var bad *ErrInvalidArgument
		switch {
		case err == nil:
			return handler(ctx, req)
		case errors.As(err, &refused):
			_ = grpc.SetHeader(ctx, metadata.Pairs("retry-after", retryAfterSeconds(refused.RetryAfter)))
			return nil, status.Errorf(codes.ResourceExhausted, "group %q is throttled: retry after %v", group, refused.RetryAfter)
		case errors.As(err, &bad):
			return nil, status.Errorf(codes.InvalidArgument, "the call's group: %v", bad)
		default:
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
}

// TenantHeader is a groupOf for Middleware: the request's X-Tenant header.
func TenantHeader(r *http.Request) string { return r.Header.Get("X-Tenant") }

// TenantMetadata is a groupOf for UnaryServerInterceptor: the call's x-tenant metadata.
func TenantMetadata(ctx context.Context, _ string) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-tenant"); len(v) > 0 {
		return v[0]
	}
	return ""
}
