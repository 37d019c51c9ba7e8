//! Empty: the package exists for its dependency tree (see Cargo.toml).
