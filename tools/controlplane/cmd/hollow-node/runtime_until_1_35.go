//go:build !since_1_36

package main

import (
	"context"
	"time"

	noopoteltrace "go.opentelemetry.io/otel/trace/noop"
	internalapi "k8s.io/cri-api/pkg/apis"
	remote "k8s.io/cri-client/pkg"
	"k8s.io/klog/v2"
)

// The kubelet's CRI client as cri-client 0.34 and 0.35 make it.
func newRuntimeClient(_ context.Context, endpoint string, timeout time.Duration) (internalapi.RuntimeService, error) {
	logger := klog.Background()
	return remote.NewRemoteRuntimeService(endpoint, timeout, noopoteltrace.NewTracerProvider(), &logger)
}
