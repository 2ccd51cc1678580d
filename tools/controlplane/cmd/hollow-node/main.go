// Command hollow-node runs the Kubernetes kubelet's own code (k8s.io/kubernetes at the
// version in go.mod) as a node without containers, for dradriver's end-to-end tests and
// `make demo`. It is kubemark's hollow kubelet (pkg/kubemark) with two changes:
//
//   - the container manager is kubemark's stub except for every DRA method, which goes
//     to the kubelet's real DRA manager (pkg/kubelet/cm/dra), wired as the real container
//     manager wires it (containermanager.go);
//   - the CRI runtime is cri-client's fake runtime except that CreateContainer resolves
//     CDI devices as containerd does (cri.go).
//
// Everything else is the kubelet: pod workers, status manager, plugin watcher on
// <root>/plugins_registry, the DRA manager with its checkpoint, events, the node lease
// and node status. The node authenticates as system:node:<name> (identity.go), so the
// Node authorizer and NodeRestriction apply as in production.
//
//	hollow-node --node NAME --root DIR --kubeconfig BOOTSTRAP [--cdi-dir DIR]...
//	            [--label K=V]... [--feature-gates G=true,...] [--v N]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/version"
	"k8s.io/klog/v2"
	kubeletapp "k8s.io/kubernetes/cmd/kubelet/app"
	"k8s.io/kubernetes/cmd/kubelet/app/options"
	cadvisortest "k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"
	"k8s.io/kubernetes/pkg/kubemark"
)

type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

type flags struct {
	node, root, kubeconfig, featureGates string
	cdiDirs, labels, execImages          stringList
}

func main() {
	var c flags
	fs := flag.NewFlagSet("hollow-node", flag.ExitOnError)
	klog.InitFlags(fs)
	fs.StringVar(&c.node, "node", "", "node name (required)")
	fs.StringVar(&c.root, "root", "", "kubelet root directory: plugins_registry/, plugins/, pods/, the DRA checkpoint (required)")
	fs.StringVar(&c.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "bootstrap kubeconfig: credentials that may create and approve the node's client certificate request")
	fs.Var(&c.cdiDirs, "cdi-dir", "CDI spec directory the runtime resolves devices from; repeatable, later ones take priority (default <root>/cdi)")
	fs.Var(&c.labels, "label", "extra Node label KEY=VALUE; repeatable")
	fs.StringVar(&c.featureGates, "feature-gates", "", "kubelet feature gates, e.g. ResourceHealthStatus=true")
	fs.Var(&c.execImages, "exec-image", "an image whose containers run as processes of this host (their command, their environment); repeatable")
	showVersion := fs.Bool("version", false, "print the kubelet version and exit")
	_ = fs.Parse(os.Args[1:])
	if *showVersion {
		fmt.Println(version.Get().GitVersion)
		return
	}
	if c.node == "" || c.root == "" || c.kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "hollow-node: --node, --root and --kubeconfig are required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, c); err != nil {
		klog.ErrorS(err, "hollow node failed", "node", c.node)
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

func run(ctx context.Context, c flags) error {
	root, err := filepath.Abs(c.root)
	if err != nil {
		return err
	}
	// kubemark's config helper makes temporary directories under $TMPDIR: keep them in
	// the node's own directory, where removing the node removes them.
	tmp := filepath.Join(root, "tmp")
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	_ = os.Setenv("TMPDIR", tmp)
	cdiDirs := []string(c.cdiDirs)
	if len(cdiDirs) == 0 {
		cdiDirs = []string{filepath.Join(root, "cdi")}
	}
	for i, d := range cdiDirs {
		if cdiDirs[i], err = filepath.Abs(d); err != nil {
			return err
		}
		if err := os.MkdirAll(cdiDirs[i], 0o755); err != nil {
			return err
		}
	}
	if c.featureGates != "" {
		gates := cliflag.NewMapStringBool(&map[string]bool{})
		if err := gates.Set(c.featureGates); err != nil {
			return fmt.Errorf("--feature-gates: %w", err)
		}
		if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(*gates.Map); err != nil {
			return fmt.Errorf("--feature-gates: %w", err)
		}
	}
	labels := map[string]string{}
	for _, kv := range c.labels {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("--label %q: want KEY=VALUE", kv)
		}
		labels[k] = v
	}
	if f, err := os.Open("/dev/kmsg"); err != nil {
		// The kubelet's OOM watcher reads the kernel log and a kubelet that cannot
		// refuses to start; say so before it does, with the fix.
		return fmt.Errorf("the kubelet's OOM watcher reads /dev/kmsg (%v): run as root, or allow it with `sysctl kernel.dmesg_restrict=0`", err)
	} else {
		f.Close()
	}

	kubeconfigPath, err := nodeKubeconfig(ctx, c.kubeconfig, c.node, root)
	if err != nil {
		return err
	}
	restCfg, err := clientcmd.BuildConfigFromFlags("", kubeconfigPath)
	if err != nil {
		return err
	}
	restCfg.UserAgent = "hollow-kubelet/" + version.Get().GitVersion
	restCfg.ContentType = "application/vnd.kubernetes.protobuf"
	restCfg.QPS, restCfg.Burst = 50, 100
	client, err := clientset.NewForConfig(restCfg)
	if err != nil {
		return err
	}

	f, kc := kubemark.GetHollowKubeletConfig(&kubemark.HollowKubeletOptions{
		NodeName: c.node, MaxPods: 110, NodeLabels: labels,
	})
	f.RootDirectory = root
	f.CertDirectory = filepath.Join(root, "pki")
	// No TCP ports: two nodes and a control plane share one loopback.
	kc.EnableServer = false
	kc.ReadOnlyPort = 0
	kc.Port = 0
	kc.HealthzPort = 0
	kc.PodLogsDir = filepath.Join(root, "logs")
	kc.StaticPodPath = ""
	// No DNS runs here, but without an address every pod gets a MissingClusterDNS
	// warning event, which would bury the events the tests and users look for. The
	// address is the dev cluster's conventional one (service range 10.96.0.0/24).
	kc.ClusterDNS = []string{"10.96.0.10"}
	kc.ClusterDomain = "cluster.local"
	// The kubelet sets its open-file limit (soft and hard) to this: keep the hard limit
	// the process already has, which it may always set without privileges.
	var nofile syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &nofile); err == nil {
		kc.MaxOpenFiles = int64(nofile.Max)
	}

	heartbeatCfg := *restCfg
	heartbeatCfg.Timeout = kc.NodeStatusUpdateFrequency.Duration
	if lease := time.Duration(kc.NodeLeaseDurationSeconds) * time.Second; heartbeatCfg.Timeout > lease {
		heartbeatCfg.Timeout = lease
	}
	heartbeatCfg.QPS = -1
	heartbeatClient, err := clientset.NewForConfig(&heartbeatCfg)
	if err != nil {
		return err
	}

	procs := newHostProcs(c.execImages, filepath.Join(root, "cri", "processes"))
	rt := newCDIRuntime(cdiDirs, filepath.Join(root, "cri", "pods"), filepath.Join(root, "cri", "state.json"), procs)
	socket := filepath.Join(root, "cri", "cri.sock")
	if err := rt.Serve(ctx, socket); err != nil {
		return err
	}
	defer rt.Stop()
	runtimeService, err := newRuntimeClient(ctx, "unix://"+socket, 15*time.Second)
	if err != nil {
		return fmt.Errorf("CRI client: %w", err)
	}

	containerManager, err := newDRAContainerManager(client, root)
	if err != nil {
		return err
	}
	hk := kubemark.NewHollowKubelet(f, kc, client, heartbeatClient,
		&cadvisortest.Fake{NodeName: c.node}, rt.ImageService, runtimeService, containerManager)
	// kubemark records events into a fake; a user reads the kubelet's events with
	// `kubectl describe pod`, and so do the tests: send them to the API server.
	hk.KubeletDeps.Recorder = nil
	hk.KubeletDeps.EventClient = client.CoreV1()

	klog.InfoS("Starting hollow node", "node", c.node, "root", root, "version", version.Get().GitVersion,
		"cdiDirs", strings.Join(cdiDirs, ","), "featureGates", c.featureGates)
	if err := kubeletapp.RunKubelet(ctx, &options.KubeletServer{KubeletFlags: *f, KubeletConfiguration: *kc}, hk.KubeletDeps); err != nil {
		return fmt.Errorf("running the kubelet: %w", err)
	}
	<-ctx.Done()
	klog.InfoS("Stopping hollow node", "node", c.node)
	return nil
}
