//! What the compiler says to code that gets the layer wrong.
//!
//! Each case in `tests/compile_fail/` is built as a small crate of its own, depending on
//! this one by path, and must fail with the crate's message (a substring, not the whole
//! output, which changes between toolchains) on every line it marks `// ERROR`. The cases
//! are type-checked only (`cargo check`), in a target directory of their own under
//! `target/tmp`, so that a second run rebuilds only the case.

use std::path::Path;
use std::process::Command;

/// The head of the `InnerService` message (src/service.rs).
const NOT_INNER: &str = "cannot be the inner service of `tower_http_retry::Retry`: it must be a `Service<http::Request<ReplayBody<";
/// The fix, from the same message's notes.
const FIX: &str = "build_http::<ReplayBody<B>>()";

/// Builds the case `name` and returns what the compiler printed, asserting that it failed.
fn check_case(name: &str) -> (String, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let source =
        std::fs::read_to_string(root.join("tests/compile_fail").join(format!("{name}.rs")))
            .expect("read the case");
    let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile-fail");
    let krate = work.join(name);
    std::fs::create_dir_all(krate.join("src")).expect("create the case's crate");
    let manifest = format!(
        r#"[package]
name = "compile-fail-{name}"
version = "0.0.0"
edition = "2024"
publish = false

[workspace]

[dependencies]
tower-http-retry = {{ path = {root:?} }}
bytes = "1"
http = "1"
http-body-util = "0.1"
hyper = "1"
hyper-util = {{ version = "0.1", features = ["client-legacy", "http1", "tokio"] }}
tower = {{ version = "0.5", features = ["util"] }}
"#,
        name = name.replace('_', "-"),
        root = root.display().to_string(),
    );
    write_if_changed(&krate.join("Cargo.toml"), &manifest);
    write_if_changed(&krate.join("src/main.rs"), &source);
    // This crate's versions, so that nothing is resolved anew (and nothing fetched).
    if !krate.join("Cargo.lock").exists() {
        std::fs::copy(root.join("Cargo.lock"), krate.join("Cargo.lock")).expect("copy Cargo.lock");
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args(["check", "--offline", "--color", "never", "--quiet"])
        .current_dir(&krate)
        .env("CARGO_TARGET_DIR", work.join("target"))
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .expect("run cargo check");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        !output.status.success(),
        "the case {name} compiled, and must not"
    );
    (source, stderr)
}

fn write_if_changed(path: &Path, text: &str) {
    if std::fs::read_to_string(path).ok().as_deref() != Some(text) {
        std::fs::write(path, text).expect("write the case");
    }
}

/// The lines (1-based) of `source` marked `// ERROR`.
fn marked_lines(source: &str) -> Vec<usize> {
    source
        .lines()
        .enumerate()
        .filter(|(_, line)| line.trim_end().ends_with("// ERROR"))
        .map(|(i, _)| i + 1)
        .collect()
}

/// Every error the compiler reported with the `InnerService` message, by the line it
/// points at.
fn lines_with_message(stderr: &str) -> Vec<usize> {
    let mut lines = Vec::new();
    let mut in_message = false;
    for line in stderr.lines() {
        if line.starts_with("error") {
            in_message = line.contains(NOT_INNER);
        } else if in_message {
            // The first location after the message is the line it points at.
            if let Some(at) = line.trim_start().strip_prefix("--> src/main.rs:") {
                if let Some(n) = at.split(':').next().and_then(|n| n.parse().ok()) {
                    lines.push(n);
                }
                in_message = false;
            }
        }
    }
    lines
}

#[test]
fn a_client_built_for_the_wrong_body_is_told_to_take_replay_body() {
    let (source, stderr) = check_case("wrong_body");
    assert!(
        stderr.contains(NOT_INNER),
        "no InnerService message:\n{stderr}"
    );
    assert!(
        stderr.contains(FIX),
        "the message does not say how to build the client:\n{stderr}"
    );
    assert!(
        stderr.contains(".map_err(|e| match e {}).boxed()"),
        "the message does not say how to make a BoxBody:\n{stderr}"
    );
    // tower's `client.oneshot(..)`: rustc reports the method's unmet bounds (E0599), not
    // the bound that would name `InnerService`; the README's troubleshooting covers it.
    let e0599 = source
        .lines()
        .position(|line| line.ends_with("// E0599"))
        .expect("the case marks its E0599 line")
        + 1;
    assert!(
        stderr.contains("error[E0599]: the method `oneshot` exists for struct `Retry<")
            && stderr.contains(&format!("src/main.rs:{e0599}:")),
        "line {e0599} is not reported as E0599 on `Retry`:\n{stderr}"
    );
    let reported = lines_with_message(&stderr);
    for line in marked_lines(&source) {
        assert!(
            reported.contains(&line),
            "line {line} of the case is not reported with the InnerService message \
             (reported: {reported:?}):\n{stderr}"
        );
    }
}
