//! A fault-injecting TCP proxy on 127.0.0.1: it forwards every connection to one upstream
//! and cuts some of them after a chosen number of the upstream's bytes, as an idle proxy or
//! a reset connection cuts a long transfer. Seeded: the same seed cuts the same connections
//! (by their order of arrival) at the same offsets.
//!
//! It runs on a thread and a runtime of its own, so a test's paused clock or its runtime
//! flavour does not reach it, and it stops when dropped. It reports each cut: how many of
//! the upstream's bytes the client had been given, and how many the proxy held (read from
//! the upstream, never forwarded), so that a test can bound what the upstream sent against
//! what the client asked for.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::oneshot;

/// How a cut ends the client's connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutMode {
    /// A reset (`SO_LINGER` 0): the client reads an error.
    Reset,
    /// An orderly close: the client reads every byte it was given, then the end of the
    /// stream early.
    Close,
}

/// Which connections are cut, and where.
#[derive(Debug, Clone, Copy)]
pub struct CutPlan {
    pub seed: u64,
    /// The share of connections cut, from 0 to 1.
    pub fraction: f64,
    /// A cut connection is cut after a number of the upstream's bytes drawn uniformly from
    /// `min_offset..max_offset`.
    pub min_offset: u64,
    pub max_offset: u64,
    pub mode: CutMode,
    /// The receive buffer of the proxy's socket to the upstream, small so that the kernel
    /// holds little the proxy cannot count (`None`: the system's).
    pub upstream_recv_buffer: Option<u32>,
}

impl CutPlan {
    /// Cuts every connection after exactly `offset` bytes.
    pub fn always_at(offset: u64) -> CutPlan {
        CutPlan {
            seed: 0,
            fraction: 1.0,
            min_offset: offset,
            max_offset: offset + 1,
            mode: CutMode::Reset,
            upstream_recv_buffer: None,
        }
    }

    /// Cuts nothing.
    pub fn never() -> CutPlan {
        CutPlan {
            fraction: 0.0,
            ..CutPlan::always_at(0)
        }
    }

    /// Where connection `index` (0 for the first accepted) is cut, if it is.
    pub fn cut_of(&self, index: u64) -> Option<u64> {
        // Two draws from the seed and the index alone: the plan does not depend on how
        // connections interleave, nor on a generator crate's version.
        let draw =
            |n: u64| splitmix64(self.seed ^ splitmix64(index.wrapping_mul(2).wrapping_add(n)));
        let share = (draw(0) >> 11) as f64 / (1u64 << 53) as f64;
        if share >= self.fraction {
            return None;
        }
        let span = self.max_offset.saturating_sub(self.min_offset).max(1);
        Some(self.min_offset + draw(1) % span)
    }
}

/// SplitMix64's output function: a well-mixed 64-bit value from any input.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One cut, as the proxy made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// The connection's index, in order of arrival.
    pub connection: u64,
    /// The upstream's bytes the client was given before the cut.
    pub forwarded: u64,
    /// The upstream's bytes the proxy had read and not forwarded.
    pub held: u64,
}

#[derive(Default)]
struct Shared {
    connections: u64,
    cuts: Vec<Cut>,
    /// Upstream bytes forwarded to clients, over every connection.
    forwarded: u64,
}

/// A running proxy.
pub struct CutProxy {
    pub addr: SocketAddr,
    shared: Arc<Mutex<Shared>>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl CutProxy {
    /// Starts a proxy to `upstream` on a free loopback port.
    pub fn start(upstream: SocketAddr, plan: CutPlan) -> CutProxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Mutex::new(Shared::default()));
        let (stop, stopped) = oneshot::channel();
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async move {
                    let listener = TcpListener::from_std(listener).unwrap();
                    tokio::select! {
                        _ = stopped => {}
                        _ = accept_loop(listener, upstream, plan, shared) => {}
                    }
                });
                // Dropping the runtime drops every connection still open.
            })
        };
        CutProxy {
            addr,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.lock().unwrap().connections
    }

    /// The cuts so far, in the order they were made.
    pub fn cuts(&self) -> Vec<Cut> {
        self.shared.lock().unwrap().cuts.clone()
    }

    /// The upstream's bytes forwarded to clients so far.
    pub fn forwarded(&self) -> u64 {
        self.shared.lock().unwrap().forwarded
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    plan: CutPlan,
    shared: Arc<Mutex<Shared>>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let index = {
            let mut shared = shared.lock().unwrap();
            shared.connections += 1;
            shared.connections - 1
        };
        let cut_at = plan.cut_of(index);
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let _ = relay(client, upstream, plan, index, cut_at, shared).await;
        });
    }
}

async fn connect(upstream: SocketAddr, recv_buffer: Option<u32>) -> std::io::Result<TcpStream> {
    let socket = match upstream {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    if let Some(size) = recv_buffer {
        socket.set_recv_buffer_size(size)?;
    }
    socket.connect(upstream).await
}

async fn relay(
    client: TcpStream,
    upstream: SocketAddr,
    plan: CutPlan,
    index: u64,
    cut_at: Option<u64>,
    shared: Arc<Mutex<Shared>>,
) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    let server = connect(upstream, plan.upstream_recv_buffer).await?;
    server.set_nodelay(true)?;
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // The client's bytes go up untouched; the cut is in the upstream's direction. At a cut
    // the task stops and hands the client's read half back.
    let (stop_up, up_stopped) = oneshot::channel::<()>();
    let up = tokio::spawn(async move {
        tokio::select! {
            _ = tokio::io::copy(&mut client_read, &mut server_write) => {
                let _ = server_write.shutdown().await;
            }
            _ = up_stopped => {}
        }
        client_read
    });
    let mut forwarded = 0u64;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = server_read.read(&mut buf).await?;
        if n == 0 {
            let _ = client_write.shutdown().await;
            break;
        }
        let n = n as u64;
        match cut_at {
            Some(at) if forwarded + n >= at => {
                let give = at - forwarded;
                client_write.write_all(&buf[..give as usize]).await?;
                forwarded += give;
                // Read no more: what the kernels still hold (this socket's receive
                // buffer, the upstream's send buffer) is bounded by their sizes, which a
                // test sets small (`upstream_recv_buffer`, nginx's `sndbuf`).
                let held = n - give;
                {
                    let mut shared = shared.lock().unwrap();
                    shared.forwarded += give;
                    shared.cuts.push(Cut {
                        connection: index,
                        forwarded,
                        held,
                    });
                }
                // The client's direction stops too.
                let _ = stop_up.send(());
                let mut client_read = up.await.map_err(std::io::Error::other)?;
                drop(server_read);
                match plan.mode {
                    CutMode::Reset => {
                        // Closed with a reset, without the orderly shutdown a dropped write
                        // half sends first.
                        client_write.as_ref().set_zero_linger()?;
                        client_write.forget();
                    }
                    CutMode::Close => {
                        // An orderly end, then the client's bytes read and dropped until it
                        // closes too (bounded): a socket closed with unread bytes is reset
                        // by the kernel, and the client's kernel then drops what the client
                        // had not read yet (an HTTP/2 client keeps sending WINDOW_UPDATEs).
                        let _ = client_write.shutdown().await;
                        let mut sink = vec![0u8; 16 * 1024];
                        let _ = tokio::time::timeout(Duration::from_secs(5), async {
                            while matches!(client_read.read(&mut sink).await, Ok(n) if n > 0) {}
                        })
                        .await;
                    }
                }
                return Ok(());
            }
            _ => {
                client_write.write_all(&buf[..n as usize]).await?;
                forwarded += n;
                shared.lock().unwrap().forwarded += n;
            }
        }
    }
    // The upstream closed: wait (bounded) for the client's side to finish too.
    let _ = tokio::time::timeout(Duration::from_secs(5), up).await;
    Ok(())
}
