module github.com/txoutbox/txoutbox/admin/browsertest

go 1.26.0

require github.com/txoutbox/txoutbox v0.1.0

require (
	github.com/chromedp/cdproto v0.159.0 // indirect
	github.com/chromedp/chromedp v0.22.1 // indirect
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect
)

replace github.com/txoutbox/txoutbox v0.1.0 => ../..
