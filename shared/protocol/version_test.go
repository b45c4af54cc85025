package protocol

import "testing"

func TestModelVersions(t *testing.T) {
	if ModelName("fraud", "v8") != "fraud@v8" || ModelName("fraud", "") != "fraud" {
		t.Fatal("ModelName")
	}
	if ModelFamily("fraud@v8") != "fraud" || ModelVersion("fraud@v8") != "v8" || ModelFamily("fraud") != "fraud" || ModelVersion("fraud") != "" {
		t.Fatal("ModelFamily/ModelVersion")
	}
	for _, c := range []struct {
		entry, model string
		want         bool
	}{
		{"fraud", "fraud", true},
		{"fraud", "fraud@v8", true},
		{"fraud@v8", "fraud@v8", true},
		{"fraud@v8", "fraud@v7", false},
		{"fraud@v8", "fraud", false},
		{"fraud", "fraudx", false},
		{"fraud", "fraudx@v1", false},
		{"fra", "fraud@v1", false},
		{"fraud@v", "fraud@v8", false},
	} {
		if got := ModelAllowed(c.entry, c.model); got != c.want {
			t.Errorf("ModelAllowed(%q, %q) = %v, want %v", c.entry, c.model, got, c.want)
		}
	}
	if !AllowedBy(nil, "x") || AllowedBy([]string{"a"}, "x") || !AllowedBy([]string{"a", "x"}, "x@1") {
		t.Fatal("AllowedBy")
	}
}
