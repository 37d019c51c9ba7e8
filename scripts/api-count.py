#!/usr/bin/env python3
"""Counts the public API of a crate from rustdoc's JSON output.

An item is anything a user can name from the crate root (a struct, an enum, a trait, a
function, a constant, a type alias...), found by walking the public modules and following
re-exports, and counted once however many paths lead to it. A method is a public function
of an inherent `impl` of a counted type, or a function declared by a counted trait; impls
of other crates' traits (`Debug`, `Clone`, `Service`...) are not counted. Modules are
neither.

    RUSTC_BOOTSTRAP=1 cargo rustdoc --lib -p tower-http-retry --all-features -- \\
        -Z unstable-options --output-format json
    python3 scripts/api-count.py target/doc/tower_http_retry.json [--list]
"""

import json
import sys


def count(doc):
    index = doc["index"]
    items = {}  # id -> (path, kind)
    methods = {}  # id -> path
    modules_seen = set()

    def entry(item_id):
        item = index.get(str(item_id))
        if item is None or item.get("crate_id", 0) != 0:
            return None  # another crate's item, re-exported: not ours to count
        return item

    def walk(module_id, path):
        if module_id in modules_seen:
            return
        modules_seen.add(module_id)
        for child in index[str(module_id)]["inner"]["module"]["items"]:
            visit(child, path, None)

    def visit(item_id, path, name):
        item = entry(item_id)
        if item is None or item.get("visibility") != "public":
            return
        kind, inner = next(iter(item["inner"].items()))
        if kind == "use":
            target = inner.get("id")
            if target is None:
                return
            if inner.get("is_glob"):
                target_item = entry(target)
                if target_item is not None and "module" in target_item["inner"]:
                    for child in target_item["inner"]["module"]["items"]:
                        visit(child, path, None)
                return
            visit(target, path, inner["name"])
            return
        name = name or item.get("name")
        if kind == "module":
            walk(item_id, path + [name])
            return
        if item_id in items:
            return
        full = "::".join(path + [name])
        items[item_id] = (full, kind)
        if kind in ("struct", "enum", "union"):
            for impl_id in inner.get("impls", []):
                impl = index[str(impl_id)]["inner"]["impl"]
                if impl.get("trait") or impl.get("blanket_impl") or impl.get("is_synthetic"):
                    continue
                for method_id in impl["items"]:
                    method = index[str(method_id)]
                    if method.get("visibility") == "public" and "function" in method["inner"]:
                        methods[method_id] = f"{full}::{method['name']}"
        elif kind == "trait":
            for method_id in inner["items"]:
                method = index[str(method_id)]
                if "function" in method["inner"]:
                    methods[method_id] = f"{full}::{method['name']}"

    root = doc["root"]
    walk(root, [index[str(root)]["name"]])
    return items, methods


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as file:
        items, methods = count(json.load(file))
    if "--list" in sys.argv[2:]:
        for path, kind in sorted(items.values()):
            print(f"{kind:10} {path}")
        for path in sorted(methods.values()):
            print(f"{'method':10} {path}")
    print(f"{len(items)} items, {len(methods)} methods")


if __name__ == "__main__":
    main()
