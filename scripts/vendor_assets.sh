#!/usr/bin/env bash
# Fetch the book's browser assets from the npm registry into _vendor/ (git-ignored), so the built book
# renders without a network: MathJax 3 (math), RequireJS and the ipywidgets HTML manager (widgets).
# _config.yml serves _vendor/ as static files and points MathJax and myst-nb's widget loader at them.
set -euo pipefail
cd "$(dirname "$0")/.."
MATHJAX=3.2.2 REQUIREJS=2.3.8 HTML_MANAGER=1.0.15
out=_vendor/vendor
stamp=_vendor/.versions
want="mathjax@$MATHJAX requirejs@$REQUIREJS html-manager@$HTML_MANAGER layout-2"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
command -v npm >/dev/null || { echo "npm is needed to fetch the book's MathJax and widget assets (apt-get install npm)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "mathjax@$MATHJAX" "requirejs@$REQUIREJS" "@jupyter-widgets/html-manager@$HTML_MANAGER" >/dev/null)
for f in "$tmp"/*.tgz; do mkdir -p "${f%.tgz}" && tar -xzf "$f" -C "${f%.tgz}"; done
hm="$out/npm/@jupyter-widgets/html-manager/dist"  # the layout the widget manager expects under its "CDN"
rm -rf _vendor && mkdir -p "$out/mathjax" "$hm"
mj="$tmp/mathjax-$MATHJAX/package/es5"
cp "$mj/tex-chtml.js" "$out/mathjax/"
mkdir -p "$out/mathjax/output/chtml/fonts" "$out/mathjax/input/tex" "$out/mathjax/ui"
cp -r "$mj/output/chtml/fonts/woff-v2" "$out/mathjax/output/chtml/fonts/"
cp -r "$mj/input/tex/extensions" "$out/mathjax/input/tex/"   # loaded on demand by \require / autoload
cp -r "$mj/ui/." "$out/mathjax/ui/"
cp -r "$mj/a11y" "$out/mathjax/"                               # loaded on demand from MathJax's menu
cp "$tmp/requirejs-$REQUIREJS/package/require.js" "$out/require.js"
cp -r "$tmp/jupyter-widgets-html-manager-$HTML_MANAGER/package/dist/." "$hm/"
rm -f "$hm"/{embed.js,embed.js.map,embed.js.LICENSE.txt,libembed-amd.js}  # only the AMD embedder is used
echo "$want" > "$stamp"
echo "book assets in _vendor/: $(du -sh _vendor | cut -f1)"
