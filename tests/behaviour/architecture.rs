//! The core knows HTTP and nothing of the protocols and clients above it: gRPC and reqwest
//! plug into the core's seams (a classifier, recognised errors, per-attempt hooks, gates)
//! and nothing in the core names them. Checked by tokens, over every source file of the
//! core: all of `src/` but `lib.rs` (which declares the optional modules) and the modules
//! themselves (`grpc.rs`, `grpc/`, `reqwest.rs`, `reqwest/`).

use std::fs;
use std::path::{Path, PathBuf};

/// What a core file must not contain: the modules above it, their crates, gRPC's header
/// names, and the features that switch them on (in `cfg`, `cfg_attr`, `any`, `all`, ...).
const FORBIDDEN: [&str; 5] = [
    "crate::grpc",
    "crate::reqwest",
    "tonic::",
    "reqwest::",
    "\"grpc-",
];
const FEATURES: [&str; 2] = ["grpc", "reqwest"];

fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("the source tree is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

/// True for the files allowed to name the protocols and clients.
fn above_the_core(relative: &Path) -> bool {
    let top = relative
        .components()
        .next()
        .and_then(|c| c.as_os_str().to_str());
    matches!(relative.to_str(), Some("lib.rs" | "grpc.rs" | "reqwest.rs"))
        || matches!(top, Some("grpc" | "reqwest")) && relative.components().count() > 1
}

/// Every place in `text` where a feature named in `FEATURES` is tested, however spaced.
fn feature_tests(text: &str) -> Vec<String> {
    let squeezed: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    FEATURES
        .iter()
        .filter(|feature| squeezed.contains(&format!("feature=\"{feature}\"")))
        .map(|feature| format!("feature = \"{feature}\""))
        .collect()
}

fn violations(relative: &Path, text: &str) -> Vec<String> {
    let mut found: Vec<String> = FORBIDDEN
        .iter()
        .filter(|token| text.contains(*token))
        .map(|token| format!("{}: {token}", relative.display()))
        .collect();
    found.extend(
        feature_tests(text)
            .into_iter()
            .map(|test| format!("{}: {test}", relative.display())),
    );
    found
}

#[test]
fn no_core_file_names_a_protocol_or_a_client_above_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut checked = 0;
    let mut found = Vec::new();
    for path in &files {
        let relative = path.strip_prefix(&root).expect("under src/");
        if above_the_core(relative) {
            continue;
        }
        checked += 1;
        let text = fs::read_to_string(path).expect("a readable source file");
        found.extend(violations(relative, &text));
    }
    // The core is most of the crate: a walk that found nothing proves nothing.
    assert!(
        checked >= 20,
        "only {checked} core files found under {}",
        root.display()
    );
    assert!(
        found.is_empty(),
        "core files name what stands above them:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_sees_what_it_looks_for() {
    // Each kind of token, in the places it would hide.
    let cases = [
        "use crate::grpc::Throttle;",
        "let code = tonic::Code::Ok;",
        "/// see [`reqwest::Client`]",
        "#[cfg(feature = \"grpc\")]",
        "#[cfg_attr(not(feature=\"reqwest\"), allow(dead_code))]",
        "#[cfg(all(test, feature =\n \"grpc\"))]",
        "const H: &str = \"grpc-timeout\";",
        "crate::reqwest::recognize(&e)",
    ];
    for case in cases {
        assert!(!violations(Path::new("x.rs"), case).is_empty(), "{case:?}");
    }
    for clean in [
        "#[cfg(feature = \"hyper\")]",
        "// gRPC's A6 names its throttle retryThrottling",
        "HintSource::Header(name)",
    ] {
        assert!(violations(Path::new("x.rs"), clean).is_empty(), "{clean:?}");
    }
    assert!(above_the_core(Path::new("grpc/config.rs")));
    assert!(above_the_core(Path::new("reqwest.rs")));
    assert!(above_the_core(Path::new("lib.rs")));
    assert!(!above_the_core(Path::new("gate/throttle.rs")));
    assert!(!above_the_core(Path::new("future.rs")));
}
