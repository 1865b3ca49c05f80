package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// With ADMIN_TOKEN the demo serves the admin page at /admin/ to those who
// present the token, and refuses everybody else.
func TestAdminMounted(t *testing.T) {
	h := startTestAppWith(t, "", func(o *appOptions) { o.config.AdminToken = "s3cret" })
	get := func(auth string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, h.srv.URL+"/admin/", nil)
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := h.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get(""); code != http.StatusUnauthorized {
		t.Fatalf("GET /admin/ without the token: %d; want 401", code)
	}
	if code, _ := get("Bearer wrong"); code != http.StatusUnauthorized {
		t.Fatalf("GET /admin/ with a wrong token: %d; want 401", code)
	}
	code, body := get("Bearer s3cret")
	if code != http.StatusOK || !strings.Contains(body, "log") {
		t.Fatalf("GET /admin/ with the token: %d; want 200 and the page listing the demo's subscriptions", code)
	}
	// Without the variable there is no admin page.
	h2 := startTestAppWith(t, "", nil)
	if status, _ := h2.do(t, http.MethodGet, "/admin/", ""); status != http.StatusNotFound {
		t.Fatalf("GET /admin/ without ADMIN_TOKEN: %d; want 404", status)
	}
}
