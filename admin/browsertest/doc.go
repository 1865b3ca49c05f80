// Package browsertest drives the admin page (package admin) in a real
// browser: headless Chromium, through the DevTools protocol
// (github.com/chromedp/chromedp). It holds only its test, and is a module
// of its own so that chromedp never reaches users of txoutbox.
//
// The test needs /usr/bin/chromium (Debian: apt-get install chromium
// chromium-driver; .ci/run installs it), or a browser named by
// TXOUTBOX_CHROMIUM. Without one it skips, unless TXOUTBOX_REQUIRE_DB is
// set (as in CI): then it fails. Screenshots go to
// TXOUTBOX_SCREENSHOT_DIR, or to a new temporary directory; the test logs
// their paths.
package browsertest
