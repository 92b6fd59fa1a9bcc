//go:build linux

package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"
)

// pki is the cluster's key material, written to files for kube-apiserver.
type pki struct {
	// servingCert is the apiserver's self-signed serving certificate (PEM). It is its own CA:
	// clients trust exactly this certificate.
	servingCert []byte
	// token is the admin's bearer token (system:masters).
	token string
}

// writePKI makes the apiserver's serving certificate and key and the service-account signing
// key pair, writes them into dir, and returns what clients need. ECDSA P-256 throughout: made in
// microseconds, where RSA keys take a noticeable part of a second each on a busy machine.
func writePKI(dir string) (*pki, error) {
	servingKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("serving key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "podgate-test-apiserver"},
		// An hour back, so that a clock step on the host does not make it "not yet valid".
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &servingKey.PublicKey, servingKey)
	if err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("service-account key: %w", err)
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("service-account key: %w", err)
	}
	tokenBytes := make([]byte, 16)
	if _, err := rand.Read(tokenBytes); err != nil {
		return nil, fmt.Errorf("token: %w", err)
	}
	p := &pki{
		servingCert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		token:       hex.EncodeToString(tokenBytes),
	}
	servingKeyPEM, err := ecKeyPEM(servingKey)
	if err != nil {
		return nil, err
	}
	saKeyPEM, err := ecKeyPEM(saKey)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{
		"apiserver.crt": p.servingCert,
		"apiserver.key": servingKeyPEM,
		"sa.key":        saKeyPEM,
		"sa.pub":        pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub}),
		// The static token file: token,user,uid,"group1,group2". system:masters passes every
		// authorizer, RBAC and Node alike.
		"tokens.csv": fmt.Appendf(nil, "%s,%s,%s,\"system:masters\"\n", p.token, adminUser, adminUser),
	}
	for name, content := range files {
		if err := os.WriteFile(dir+"/"+name, content, 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func ecKeyPEM(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("marshal key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}
