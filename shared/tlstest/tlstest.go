// Package tlstest writes a throw-away certificate authority with a server
// certificate (for 127.0.0.1 and localhost) and a client certificate, for
// tests of TLS and mutual TLS against real servers.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Files are the PEM files of a test CA.
type Files struct {
	CA                    string // the CA certificate
	ServerCert, ServerKey string // for 127.0.0.1, ::1 and localhost
	ClientCert, ClientKey string // client authentication, CN "mlsched-client"
}

// New writes a CA, a server and a client certificate under t.TempDir().
func New(t testing.TB) Files {
	t.Helper()
	dir := t.TempDir()
	f, err := Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// Write writes the files into dir.
func Write(dir string) (Files, error) {
	f := Files{
		CA:         filepath.Join(dir, "ca.pem"),
		ServerCert: filepath.Join(dir, "server.pem"), ServerKey: filepath.Join(dir, "server-key.pem"),
		ClientCert: filepath.Join(dir, "client.pem"), ClientKey: filepath.Join(dir, "client-key.pem"),
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "mlsched test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return f, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return f, err
	}
	if err := writePEM(f.CA, "CERTIFICATE", caDER); err != nil {
		return f, err
	}
	leaf := func(serial int64, cn string, usage x509.ExtKeyUsage, server bool, certFile, keyFile string) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		}
		if server {
			tmpl.DNSNames = []string{"localhost"}
			tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		kb, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return err
		}
		if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
			return err
		}
		return writePEM(keyFile, "EC PRIVATE KEY", kb)
	}
	if err := leaf(2, "localhost", x509.ExtKeyUsageServerAuth, true, f.ServerCert, f.ServerKey); err != nil {
		return f, err
	}
	return f, leaf(3, "mlsched-client", x509.ExtKeyUsageClientAuth, false, f.ClientCert, f.ClientKey)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
