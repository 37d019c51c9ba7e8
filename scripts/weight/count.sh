#!/usr/bin/env bash
# The weight of the layer in a small HTTP/1 client (Cargo.toml beside this file): how many
# crates its normal dependency tree (`cargo tree -e normal`, this machine's target) holds
# with tower's own retry, with the layer and its defaults, and with the layer lean; then
# what each of the layer's features adds, in that client and to the layer alone. A crate is
# a name and a version, counted once; the client's own package is left out. The versions
# are the workspace's: its Cargo.lock is copied here first (and ignored by git).
# Run: bash scripts/weight/count.sh
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")"
cp ../../Cargo.lock Cargo.lock

# The crates of a tree, one "name version" a line, sorted.
crates() {
    cargo tree -e normal --prefix none --quiet "$@" |
        sed -E 's/ \(\*\)$//; s/ \((proc-macro|\/.*)\)$//' |
        grep -v '^tower-http-retry-weight ' | sort -u
}
count() {
    local list
    list="$(crates "$@")"
    wc -l <<<"$list" | tr -d ' '
}
# What a feature adds to a tree: the crates' names.
added() {
    local base with names
    base="$(crates $1)"
    with="$(crates $2)"
    names="$(comm -13 <(echo "$base") <(echo "$with") | cut -d' ' -f1 | paste -sd' ' -)"
    echo "${names:-nothing}"
}

row() {
    printf "  %-32s %s\n" "$1" "$2"
}
echo "crates in the client's tree"
n="$(count --no-default-features --features tower-retry)"
row "tower's retry" "$n"
n="$(count)"
row "the layer, default features" "$n"
n="$(count --no-default-features --features lean)"
row "the layer, lean (tokio, hyper)" "$n"
n="$(count --no-default-features --features bare)"
row "the layer, no features" "$n"

echo "what each feature adds"
echo "  to the client with the layer lean:"
lean="--no-default-features --features lean"
for feature in tracing h2 metrics test-util; do
    names="$(added "$lean" "$lean,tower-http-retry/$feature")"
    row "  $feature" "$names"
done
# The layer alone: its own tree in the repository's workspace.
core="--manifest-path ../../Cargo.toml -p tower-http-retry --no-default-features"
n="$(count $core)"
echo "  to the layer alone, no features ($n crates, itself included):"
for feature in tokio tracing hyper h2 metrics test-util; do
    names="$(added "$core" "$core --features $feature")"
    row "  $feature" "$names"
done
