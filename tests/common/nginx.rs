//! A real nginx on 127.0.0.1, started by a test with its own config, ports, logs and
//! temporary directories, and stopped (its directory removed) when dropped.
//!
//! nginx comes from Debian's `nginx-light` (`.ci/run` installs it). Without it a test fails
//! under `CI=true`, and elsewhere says on the terminal that it skipped.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The nginx binary, or `None` (after saying so) when `test` should skip. Under `CI=true`
/// a missing nginx fails the test.
pub fn binary(test: &str) -> Option<PathBuf> {
    let candidates = ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"];
    let found = candidates
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .or_else(|| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|dir| dir.join("nginx"))
                    .find(|p| p.exists())
            })
        });
    if found.is_none() {
        super::missing(test, "nginx", "apt-get install -y nginx-light");
    }
    found
}

/// A free loopback port: bound, read and released for a server to take.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running nginx.
pub struct Nginx {
    child: Child,
    dir: PathBuf,
    /// The ports its servers listen on, in the order the config was given them.
    pub ports: Vec<u16>,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Nginx {
    /// Starts `binary` with `servers` as the `http` block's server blocks; the config gets
    /// `ports` free ports (`servers` is given them) and `log_format` as the access log's
    /// format. Waits, at most 5 s, until every port listens.
    pub fn start(
        binary: &Path,
        ports: usize,
        log_format: &str,
        servers: impl FnOnce(&[u16]) -> String,
    ) -> Nginx {
        let dir = std::env::temp_dir().join(format!(
            "tower-http-retry-nginx-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        for sub in ["", "logs", "tmp"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        // Held together while they are picked: one at a time, the system can hand the same
        // port out twice.
        let held: Vec<std::net::TcpListener> = (0..ports)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let ports: Vec<u16> = held
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        drop(held);
        let d = dir.display();
        let servers = servers(&ports);
        let config = format!(
            r#"daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/logs/error.log warn;
events {{ worker_connections 1024; }}
http {{
    log_format test '{log_format}';
    access_log {d}/logs/access.log test;
    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
{servers}
}}
"#
        );
        std::fs::write(dir.join("nginx.conf"), config).unwrap();
        let child = Command::new(binary)
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("nginx starts");
        let nginx = Nginx { child, dir, ports };
        // Wait, bounded, for nginx to listen.
        for _ in 0..200 {
            let up = |port: &u16| std::net::TcpStream::connect(("127.0.0.1", *port)).is_ok();
            if nginx.ports.iter().all(up) {
                return nginx;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!(
            "nginx did not listen on 127.0.0.1 ports {:?} within 5 s: {}",
            nginx.ports,
            std::fs::read_to_string(nginx.dir.join("logs/error.log")).unwrap_or_default()
        );
    }

    /// The access log so far, one line per request in the config's `log_format`.
    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("logs/access.log")).unwrap_or_default()
    }
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    h.finish()
}
