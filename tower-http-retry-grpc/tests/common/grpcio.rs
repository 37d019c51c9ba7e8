//! A server written with Python's grpcio (gRPC's C core underneath), `tests/grpcio/server.py`,
//! started on a free port of 127.0.0.1 with its own scripted plan, and the interpreter
//! that runs it and gRPC's reference client (`tests/grpcio/client.py`).
//!
//! grpcio comes from PyPI (`.ci/run` installs it: `python3 -m pip install grpcio==1.85.3`).
//! The interpreter is `python3`, or the one `PYTHON3` names. Without grpcio a test fails
//! under `CI=true`, and elsewhere says on the terminal that it skipped.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use super::grpc::unary;

/// The script's record of every call so far (takes no step of the plan).
pub const SEEN: &str = "/test.Control/Seen";
/// The grpcio version `.ci/run` installs, and these tests were written against.
pub const GRPCIO: &str = "1.85.3";

/// The Python interpreter with grpcio, or `None` (after saying so) when the test should
/// skip. Under `CI=true` a missing grpcio fails the test.
pub fn python(test: &str) -> Option<&'static str> {
    static PYTHON: OnceLock<Option<String>> = OnceLock::new();
    let found = PYTHON.get_or_init(|| {
        let python = std::env::var("PYTHON3").unwrap_or_else(|_| "python3".to_string());
        let ok = Command::new(&python)
            .args(["-c", "import grpc"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(python)
    });
    match found {
        Some(python) => Some(python.as_str()),
        None => {
            let install = format!("python3 -m pip install grpcio=={GRPCIO}");
            super::missing(test, "Python's grpcio", &install);
            None
        }
    }
}

/// A running `tests/grpcio/server.py`; killed (and reaped) when dropped, a panicking test
/// included. The script also exits when its stdin closes and after its lifetime.
pub struct GrpcioServer {
    child: Child,
    _stdin: ChildStdin,
    pub port: u16,
}

impl Drop for GrpcioServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl GrpcioServer {
    /// Starts the script with `plan` (its steps, see the script's docs) and waits, at most
    /// 20 s, for it to say which port it serves on.
    pub fn start(python: &str, plan: &[&str]) -> GrpcioServer {
        Self::start_with(python, plan, &[] as &[&str], "60")
    }

    /// [`start`](Self::start) with grpc server options (`NAME=VALUE`, the script's
    /// `--option`) and a lifetime in seconds.
    pub fn start_with(
        python: &str,
        plan: &[impl AsRef<str>],
        options: &[impl AsRef<str>],
        lifetime_s: &str,
    ) -> GrpcioServer {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/grpcio/server.py");
        let plan: Vec<&str> = plan.iter().map(AsRef::as_ref).collect();
        let mut command = Command::new(python);
        command
            .arg(script)
            .arg("--plan")
            .arg(plan.join(","))
            .args(["--lifetime", lifetime_s]);
        for option in options {
            command.arg("--option").arg(option.as_ref());
        }
        let mut child = command
            .env("GRPC_VERBOSITY", "ERROR")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start tests/grpcio/server.py");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        // The guard exists before the wait, so a timeout below still kills the child.
        let mut server = GrpcioServer {
            child,
            _stdin: stdin,
            port: 0,
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the grpcio server reports its port within 20 s");
        server.port = line
            .strip_prefix("PORT ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("the grpcio server said {line:?}, not PORT <n>"));
        server
    }

    /// `127.0.0.1:port`, as grpcio's client takes it.
    pub fn target(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn uri(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub async fn channel(&self) -> Channel {
        Endpoint::from_shared(self.uri())
            .unwrap()
            .connect()
            .await
            .expect("connect to the grpcio server")
    }

    /// Every call of a `test.Raw` method so far, as the server recorded it, asked over a
    /// channel of its own (no layer).
    pub async fn seen(&self) -> Vec<Call> {
        let reply = unary(self.channel().await, SEEN, b"")
            .await
            .expect("the server's record");
        let calls: Vec<serde_json::Value> =
            serde_json::from_slice(reply.get_ref()).expect("JSON records");
        calls.iter().map(Call::from_json).collect()
    }
}

/// One call as the grpcio server saw it.
#[derive(Debug)]
pub struct Call {
    pub method: String,
    /// The step of the plan it took.
    pub step: String,
    /// When it arrived, in milliseconds since the server started.
    pub arrived_ms: f64,
    /// Its metadata as grpcio gives it to handlers (no `grpc-timeout`: C core turns that
    /// into the call's deadline).
    pub metadata: Vec<(String, String)>,
    /// Seconds left before the call's deadline, as grpcio says (`context.time_remaining()`);
    /// about 9.2e18 without one.
    pub time_remaining: f64,
    /// The request messages.
    pub messages: Vec<Vec<u8>>,
    /// The client cancelled the call while a `sleep` step held it (a hedge that lost).
    pub cancelled: bool,
}

impl Call {
    pub fn from_json(value: &serde_json::Value) -> Call {
        let text = |v: &serde_json::Value| v.as_str().expect("a string").to_string();
        Call {
            method: text(&value["method"]),
            step: text(&value["step"]),
            arrived_ms: value["arrived_ms"].as_f64().expect("arrived_ms"),
            metadata: value["metadata"]
                .as_array()
                .expect("metadata")
                .iter()
                .map(|pair| (text(&pair[0]), text(&pair[1])))
                .collect(),
            time_remaining: value["time_remaining"].as_f64().expect("time_remaining"),
            messages: value["messages"]
                .as_array()
                .expect("messages")
                .iter()
                .map(|m| unhex(m.as_str().expect("hex")))
                .collect(),
            cancelled: value["cancelled"].as_bool().expect("cancelled"),
        }
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.metadata
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The deadline grpcio derived from `grpc-timeout`, if the call had one.
    pub fn deadline(&self) -> Option<Duration> {
        (self.time_remaining < 1e9).then(|| Duration::from_secs_f64(self.time_remaining))
    }
}

pub fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex digits"))
        .collect()
}

/// Held by each test that starts several Python processes and an nginx at once (the
/// differential scenarios) for as long as it runs: two of them together on a 2-core
/// machine starve each other's real-time clocks. A tokio mutex, which any test's runtime
/// can wait on.
pub async fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    HEAVY.lock().await
}
