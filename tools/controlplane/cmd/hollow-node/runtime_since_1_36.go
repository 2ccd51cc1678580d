//go:build since_1_36

package main

import (
	"context"
	"time"

	noopoteltrace "go.opentelemetry.io/otel/trace/noop"
	internalapi "k8s.io/cri-api/pkg/apis"
	remote "k8s.io/cri-client/pkg"
)

// The kubelet's CRI client as cri-client 0.36 makes it: a context for its logger, and
// unary list calls (useStreaming), as the kubelet's own default (the CRIListStreaming
// gate, off) has them.
func newRuntimeClient(ctx context.Context, endpoint string, timeout time.Duration) (internalapi.RuntimeService, error) {
	return remote.NewRemoteRuntimeService(ctx, endpoint, timeout, noopoteltrace.NewTracerProvider(), false)
}
