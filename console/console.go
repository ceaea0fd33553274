// Package console is the controller's web console: static pages (HTML,
// plain JavaScript, uPlot from npm, pinned in web/package-lock.json and
// copied into assets/ by `make console-assets`), embedded in the binary
// and served under /ui/ beside the API. The pages hold no data of their
// own and no secret: they ask the operator for an API token, keep it in
// the tab's sessionStorage, and send it as a bearer token on every call
// of the controller's API, which authenticates each call as it does for
// `sluice ctl`. Serving the files needs no token; everything they show
// does. It must not reach past the API: no access to the controller's
// state but through its HTTP routes.
package console

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed assets
var assets embed.FS

// Prefix is where the console is served.
const Prefix = "/ui/"

// CSP is the Content-Security-Policy of every console file: scripts,
// styles and API calls from the controller's own origin only, no inline
// script or style, no frames, no plugins, no forms posted anywhere.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the console under Prefix, redirects / there, and hands
// every other request to api.
func Handler(api http.Handler) http.Handler {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded directory is there by construction
	}
	files := http.StripPrefix(Prefix, http.FileServer(http.FS(sub)))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/" || r.URL.Path == strings.TrimSuffix(Prefix, "/"):
			http.Redirect(w, r, Prefix, http.StatusFound)
		case strings.HasPrefix(r.URL.Path, Prefix):
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				w.Header().Set("Allow", "GET, HEAD")
				http.Error(w, "the console's files are read only", http.StatusMethodNotAllowed)
				return
			}
			h := w.Header()
			h.Set("Content-Security-Policy", CSP)
			h.Set("X-Content-Type-Options", "nosniff")
			h.Set("X-Frame-Options", "DENY")
			h.Set("Referrer-Policy", "no-referrer")
			h.Set("Cache-Control", "no-cache")
			files.ServeHTTP(w, r)
		default:
			api.ServeHTTP(w, r)
		}
	})
}
