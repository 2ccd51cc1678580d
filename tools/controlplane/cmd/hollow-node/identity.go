package main

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"
	"k8s.io/client-go/util/keyutil"
	"k8s.io/klog/v2"
)

// nodeKubeconfig returns a kubeconfig in which the node is itself: a client
// certificate for user system:node:<name> in group system:nodes, so the API server's
// Node authorizer and NodeRestriction admission treat it as they treat a production
// kubelet. The certificate comes from the cluster's own signer
// (kubernetes.io/kube-apiserver-client-kubelet), requested and approved with the
// bootstrap credentials, as a kubelet's TLS bootstrap would end; it is kept in
// <root>/pki and reused while it is valid for more than an hour.
func nodeKubeconfig(ctx context.Context, bootstrapPath, node, root string) (string, error) {
	pkiDir := filepath.Join(root, "pki")
	keyPath := filepath.Join(pkiDir, "kubelet-client.key")
	certPath := filepath.Join(pkiDir, "kubelet-client.crt")
	out := filepath.Join(root, "kubelet.kubeconfig")

	boot, err := clientcmd.LoadFromFile(bootstrapPath)
	if err != nil {
		return "", fmt.Errorf("reading kubeconfig %s: %w", bootstrapPath, err)
	}
	restCfg, err := clientcmd.NewDefaultClientConfig(*boot, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return "", fmt.Errorf("kubeconfig %s: %w", bootstrapPath, err)
	}
	if !certValid(certPath, node) {
		if err := os.MkdirAll(pkiDir, 0o700); err != nil {
			return "", err
		}
		client, err := clientset.NewForConfig(restCfg)
		if err != nil {
			return "", err
		}
		if err := requestNodeCert(ctx, client, node, keyPath, certPath); err != nil {
			return "", fmt.Errorf("node identity for %s: %w", node, err)
		}
	}
	cfg := clientcmdapi.NewConfig()
	cluster := clientcmdapi.NewCluster()
	cluster.Server = restCfg.Host
	cluster.CertificateAuthorityData = restCfg.CAData
	if len(cluster.CertificateAuthorityData) == 0 && restCfg.CAFile != "" {
		if cluster.CertificateAuthorityData, err = os.ReadFile(restCfg.CAFile); err != nil {
			return "", err
		}
	}
	cluster.InsecureSkipTLSVerify = restCfg.Insecure
	auth := clientcmdapi.NewAuthInfo()
	auth.ClientCertificate, auth.ClientKey = certPath, keyPath
	kctx := clientcmdapi.NewContext()
	kctx.Cluster, kctx.AuthInfo = "cluster", "node"
	cfg.Clusters["cluster"], cfg.AuthInfos["node"], cfg.Contexts["node"] = cluster, auth, kctx
	cfg.CurrentContext = "node"
	if err := clientcmd.WriteToFile(*cfg, out); err != nil {
		return "", err
	}
	return out, nil
}

func certValid(path, node string) bool {
	data, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return false
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return false
	}
	return c.Subject.CommonName == "system:node:"+node && time.Until(c.NotAfter) > time.Hour
}

func requestNodeCert(ctx context.Context, client clientset.Interface, node, keyPath, certPath string) error {
	keyPEM, err := keyutil.MakeEllipticPrivateKeyPEM()
	if err != nil {
		return err
	}
	key, err := keyutil.ParsePrivateKeyPEM(keyPEM)
	if err != nil {
		return err
	}
	csrPEM, err := certutil.MakeCSR(key, &pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}, nil, nil)
	if err != nil {
		return err
	}
	name := fmt.Sprintf("hollow-node-%s-%d", node, time.Now().UnixNano())
	usages := []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
	reqName, reqUID, err := csr.RequestCertificateWithContext(ctx, client, csrPEM, name, certificatesv1.KubeAPIServerClientKubeletSignerName, nil, usages, key)
	if err != nil {
		return fmt.Errorf("creating CertificateSigningRequest: %w", err)
	}
	// kube-controller-manager's csrapproving controller approves a node client request
	// of a requester allowed to create one (system:masters is); approve it ourselves
	// only where it has not.
	if err := approve(ctx, client, reqName); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	certPEM, err := csr.WaitForCertificate(wctx, client, reqName, reqUID)
	if err != nil {
		return fmt.Errorf("waiting for the signed certificate of %s (is kube-controller-manager running with a cluster signing key?): %w", reqName, err)
	}
	if err := keyutil.WriteKey(keyPath, keyPEM); err != nil {
		return err
	}
	if err := os.WriteFile(certPath, certPEM, 0o600); err != nil {
		return err
	}
	// The request has served its purpose; leaving it would only clutter `kubectl get csr`.
	_ = client.CertificatesV1().CertificateSigningRequests().Delete(ctx, reqName, metav1.DeleteOptions{})
	klog.InfoS("Node identity issued", "node", node, "user", "system:node:"+node, "cert", certPath)
	return nil
}

func approve(ctx context.Context, client clientset.Interface, name string) error {
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		obj, err := client.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range obj.Status.Conditions {
			if c.Type == certificatesv1.CertificateApproved && c.Status == v1.ConditionTrue {
				return nil
			}
		}
		obj.Status.Conditions = append(obj.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: v1.ConditionTrue,
			Reason: "HollowNode", Message: "approved by the hollow node with its bootstrap credentials",
		})
		if _, lastErr = client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, name, obj, metav1.UpdateOptions{}); lastErr == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("approving CertificateSigningRequest %s: %w", name, lastErr)
}
