package natsconn_test

import (
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/mlsched/mlsched/shared/natsconn"
)

func TestPoolKeyFile(t *testing.T) {
	acc, _ := nkeys.CreateAccount()
	accPub, _ := acc.PublicKey()
	signer, _ := nkeys.CreateAccount()
	seed, _ := signer.Seed()
	b := natsconn.FormatPoolKey(accPub, seed)
	gotAcc, gotSigner, err := natsconn.ParsePoolKey(b)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := signer.PublicKey()
	if got, _ := gotSigner.PublicKey(); gotAcc != accPub || got != want {
		t.Errorf("round trip: account %s signer %s, want %s %s", gotAcc, got, accPub, want)
	}
	user, _ := nkeys.CreateUser()
	useed, _ := user.Seed()
	for name, bad := range map[string]string{
		"no account":     string(seed) + "\n",
		"no seed":        "account: " + accPub + "\n",
		"user seed":      "account: " + accPub + "\n" + string(useed) + "\n",
		"not a seed":     "account: " + accPub + "\nhello\n",
		"a user account": "account: UABC\n" + string(seed) + "\n",
	} {
		if _, _, err := natsconn.ParsePoolKey([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestPoolIdentityStableAndExclusive(t *testing.T) {
	c := natsconn.Config{PoolKey: "/nonexistent"}
	a, err := c.PoolIdentity()
	if err != nil {
		t.Fatal(err)
	}
	copied := c
	if b, _ := copied.PoolIdentity(); b != a || !nkeys.IsValidPublicUserKey(a) {
		t.Errorf("identity %q, copy's %q: want one user key", a, b)
	}
	if other, _ := (&natsconn.Config{PoolKey: "/nonexistent"}).PoolIdentity(); other == a {
		t.Error("two processes got the same identity")
	}
	if _, err := c.Options(""); err == nil || !strings.Contains(err.Error(), "MLSCHED_NATS_POOL_KEY") {
		t.Errorf("a missing pool key file: %v", err)
	}
	c.Creds = "x.creds"
	if err := c.Validate(); err == nil {
		t.Error("pool key and creds together accepted")
	}
}
