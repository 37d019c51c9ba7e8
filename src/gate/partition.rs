// Partitions: one gate state per authority (the request URI's scheme, host and port), for
// a client that reaches many servers. A server that fails drains its own partition only,
// so a healthy one keeps its retries.
//
// The map is a `std::sync::RwLock<HashMap>`: a request to an authority already known takes
// the read lock only (shared by every thread; no writer waits on the success path), and
// clones the partition's handle (one reference-count increment). The write lock is taken
// only when an authority is seen for the first time. A sharded or copy-on-write map would
// also avoid the exclusive lock, but a read lock is enough for a lookup this short, keeps
// the dependency tree as it is, and needs no unsafe code.
//
// The map holds at most `max` authorities. Only a partition at rest may be forgotten: back
// at its full state, and held by no request in flight. Making it again later starts it
// full, which changes nothing, so a failing server can never reset its state by being
// evicted (this matters for the throttle and the quota, which do not refill with time).
// When all `max` are in use, further authorities share one overflow partition, and a
// partition made later starts from the overflow's state, so that an authority that failed
// there gains nothing by getting a place of its own (a healthy newcomer pays for that until
// its successes, or for a budget the time, refill it). While the map is full, the overflow's
// authorities take the read lock only, and the map is scanned for a partition at rest at
// most once per 100 ms. Partitions of servers that failed and were never heard of again
// stay (a throttle or a quota refills only with successes): enough of them keep the map
// full, and further authorities then share the overflow. Requests with no authority
// (no authority in the URI and no `Host` header) share the gate's own state.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use http::HeaderMap;
use http::uri::{Authority, Uri};

use super::Kind;
use super::clock::GateClock;
use crate::time::Clock;

/// The most authorities a per-authority gate tracks unless told otherwise.
pub(crate) const DEFAULT_MAX_AUTHORITIES: usize = 1_024;

/// One gate state, as a partition holds it: a handle on a shared state.
pub trait Part: Clone {
    /// A new state with the same settings, at its full state.
    fn fresh(&self) -> Self;
    /// A new state with the same settings, at this one's balance now.
    fn successor(&self) -> Self;
    /// Whether the state is back at its full state and held by nothing but the map
    /// (`self` being the map's handle).
    fn at_rest(&self) -> bool;
}

/// Which server a request goes to, as partitions tell them apart: the scheme, the host
/// (case-insensitive) and the port (the scheme's default when none is written), as one
/// normalised text, `scheme://host:port` in lower case. It is built on the stack for the
/// usual lengths, so that finding a known authority allocates nothing and touches no
/// shared reference count; only a new authority's key is copied into the map.
#[derive(Clone)]
pub(crate) struct AuthorityKey(KeyText);

/// The longest key kept on the stack; longer ones (rare: a host of over 100 characters)
/// are built on the heap.
const INLINE: usize = 128;

#[derive(Clone)]
enum KeyText {
    Inline { bytes: [u8; INLINE], len: usize },
    Heap(Vec<u8>),
}

impl AuthorityKey {
    /// The key of a request: its URI's authority, else (origin form) its `Host` header;
    /// `None` with neither, or with a `Host` that is not an authority.
    pub(crate) fn of(uri: &Uri, headers: &HeaderMap) -> Option<AuthorityKey> {
        match uri.authority() {
            Some(authority) => Some(Self::new(uri.scheme_str().unwrap_or(""), authority)),
            None => {
                let host = headers.get(http::header::HOST)?;
                let authority = Authority::try_from(host.as_bytes()).ok()?;
                Some(Self::new("", &authority))
            }
        }
    }

    /// The key of a URI's authority, if it has one.
    pub(crate) fn of_uri(uri: &Uri) -> Option<AuthorityKey> {
        let authority = uri.authority()?;
        Some(Self::new(uri.scheme_str().unwrap_or(""), authority))
    }

    fn new(scheme: &str, authority: &Authority) -> AuthorityKey {
        // One pass over the authority as written: no userinfo, the host, and the port's
        // digits if any (a URI's authority is already validated).
        let text = authority.as_str().as_bytes();
        let text = match memchr_last(b'@', text) {
            Some(at) => &text[at + 1..],
            None => text,
        };
        let default: &[u8] = if scheme.eq_ignore_ascii_case("https") {
            b"443"
        } else if scheme.eq_ignore_ascii_case("http") {
            b"80"
        } else {
            b""
        };
        let (host, port): (&[u8], &[u8]) = match memchr_last(b':', text) {
            // Not the last colon of an IPv6 literal without a port. An empty port is the
            // default one.
            Some(colon) if !text[colon..].contains(&b']') => match &text[colon + 1..] {
                [] => (&text[..colon], default),
                port => (&text[..colon], port),
            },
            _ => (text, default),
        };
        let parts: [&[u8]; 5] = [scheme.as_bytes(), b"://", host, b":", port];
        let len: usize = parts.iter().map(|part| part.len()).sum();
        let mut key = match len <= INLINE {
            true => KeyText::Inline {
                bytes: [0; INLINE],
                len: 0,
            },
            false => KeyText::Heap(Vec::with_capacity(len)),
        };
        for part in parts {
            key.push_lowercase(part);
        }
        AuthorityKey(key)
    }

    fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            KeyText::Inline { bytes, len } => &bytes[..*len],
            KeyText::Heap(text) => text,
        }
    }

    #[cfg(all(test, not(tower_http_retry_loom)))]
    fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap()
    }

    #[cfg(all(test, not(tower_http_retry_loom)))]
    fn port(&self) -> &str {
        self.as_str().rsplit(':').next().unwrap_or("")
    }
}

/// The last position of `byte` in `text`.
fn memchr_last(byte: u8, text: &[u8]) -> Option<usize> {
    text.iter().rposition(|&b| b == byte)
}

impl KeyText {
    fn push_lowercase(&mut self, part: &[u8]) {
        match self {
            KeyText::Inline { bytes, len } => {
                let slot = &mut bytes[*len..*len + part.len()];
                slot.copy_from_slice(part);
                slot.make_ascii_lowercase();
                *len += part.len();
            }
            KeyText::Heap(text) => text.extend(part.iter().map(u8::to_ascii_lowercase)),
        }
    }
}

impl std::fmt::Debug for AuthorityKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.as_bytes()))
    }
}

impl PartialEq for AuthorityKey {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

/// A gate's state: one for every request, or one per authority (and the gate's own for
/// requests with none). Dereferences to the state requests use when not partitioned.
pub struct Scoped<I> {
    inner: Arc<I>,
    partitions: Option<Arc<Partitions<Arc<I>>>>,
}

impl<I> Clone for Scoped<I> {
    fn clone(&self) -> Self {
        Scoped {
            inner: Arc::clone(&self.inner),
            partitions: self.partitions.clone(),
        }
    }
}

impl<I> std::ops::Deref for Scoped<I> {
    type Target = I;

    fn deref(&self) -> &I {
        &self.inner
    }
}

impl<I> Scoped<I>
where
    Arc<I>: Part,
{
    /// `inner`, and, with `authorities`, partitions of its settings, at most that many,
    /// reading the time on `clock` (the gate's, which `inner` holds if it reads the time).
    pub(crate) fn new(inner: I, authorities: Option<usize>, clock: GateClock) -> Self {
        let inner = Arc::new(inner);
        let partitions = authorities.map(|max| Arc::new(Partitions::new(&inner, max, clock)));
        Scoped { inner, partitions }
    }

    pub(crate) fn is_per_authority(&self) -> bool {
        self.partitions.is_some()
    }

    /// The state of the authority `key` names, unpartitioned: the partition's for a gate
    /// per authority and a key, else this one's.
    pub(crate) fn partition_of(&self, key: Option<AuthorityKey>) -> Self {
        let inner = match (&self.partitions, key) {
            (Some(partitions), Some(key)) => partitions.get(key),
            _ => Arc::clone(&self.inner),
        };
        Scoped {
            inner,
            partitions: None,
        }
    }

    /// How many authorities have a state of their own.
    #[cfg(test)]
    pub(crate) fn authorities(&self) -> usize {
        self.partitions.as_ref().map_or(0, |p| p.len())
    }

    /// The most authorities tracked, for a gate per authority.
    pub(crate) fn max_authorities(&self) -> Option<usize> {
        self.partitions.as_ref().map(|p| p.max())
    }

    /// True when two handles share one state.
    #[cfg(all(test, not(tower_http_retry_loom)))]
    pub(crate) fn same_as(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl<K: Kind> Scoped<K> {
    /// Gives the gate `clock`, unless it has one (its state's and its partitions' clock,
    /// one for all of them).
    pub(crate) fn bind(&self, clock: &Clock) {
        if let Some(own) = self.inner.clock() {
            own.bind(clock);
        }
        if let Some(partitions) = &self.partitions {
            partitions.clock.bind(clock);
        }
    }
}

/// The partitions of one gate.
pub(crate) struct Partitions<T> {
    map: RwLock<HashMap<Box<[u8]>, T>>,
    /// Shared by the authorities that found the map full of partitions in use.
    overflow: T,
    max: usize,
    /// While the map is full, the earliest time (in milliseconds on `clock`) at which an
    /// authority without a partition looks again for one at rest to replace: an authority
    /// in the overflow takes the read lock only, and the map is scanned at most once per
    /// [`RESCAN_MS`].
    next_scan_ms: AtomicU64,
    /// The gate's clock.
    clock: GateClock,
}

/// How often, at most, a full map is scanned for a partition at rest.
const RESCAN_MS: u64 = 100;

impl<T: Part> Partitions<T> {
    /// Partitions of `template`'s settings, at most `max` of them (at least 1).
    pub(crate) fn new(template: &T, max: usize, clock: GateClock) -> Self {
        Partitions {
            map: RwLock::new(HashMap::new()),
            overflow: template.fresh(),
            max: max.max(1),
            next_scan_ms: AtomicU64::new(0),
            clock,
        }
    }

    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// The partition of `key`, made (full) on first sight.
    pub(crate) fn get(&self, key: AuthorityKey) -> T {
        {
            let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(part) = map.get(key.as_bytes()) {
                return part.clone();
            }
            if map.len() >= self.max && !self.may_scan() {
                return self.overflow.clone();
            }
        }
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(part) = map.get(key.as_bytes()) {
            return part.clone();
        }
        if map.len() >= self.max {
            // Forget one partition at rest, if there is one: it would be made as it is.
            let rest = map
                .iter()
                .find(|(_, part)| part.at_rest())
                .map(|(key, _)| key.clone());
            match rest {
                Some(rest) => {
                    map.remove(&rest);
                }
                None => return self.overflow.clone(),
            }
        }
        // A new partition starts from the overflow's state, which is full unless
        // authorities that shared it failed there: one of them may be this one, and it
        // must not get a full state by moving out.
        let part = self.overflow.successor();
        map.insert(key.as_bytes().into(), part.clone());
        part
    }

    /// Whether this lookup may scan the full map for a partition at rest: at most one per
    /// [`RESCAN_MS`], so that authorities in the overflow do not all take the write lock.
    fn may_scan(&self) -> bool {
        let elapsed = self.clock.elapsed();
        let now = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        let next = self.next_scan_ms.load(Ordering::Relaxed);
        now >= next
            && self
                .next_scan_ms
                .compare_exchange(next, now + RESCAN_MS, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// How many authorities have a partition of their own.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(all(test, not(tower_http_retry_loom)))]
mod tests {
    use super::*;

    fn key(uri: &str) -> Option<AuthorityKey> {
        AuthorityKey::of(&uri.parse().unwrap(), &HeaderMap::new())
    }

    #[test]
    fn a_key_is_scheme_host_and_port() {
        assert_eq!(key("http://Example.COM/a"), key("http://example.com:80/b"));
        assert_eq!(key("https://example.com/"), key("https://example.com:443/"));
        assert_ne!(key("http://example.com/"), key("https://example.com/"));
        assert_ne!(key("http://example.com/"), key("http://example.com:8080/"));
        assert_ne!(key("http://a.example/"), key("http://b.example/"));
        assert_eq!(key("/path"), None);
        // Origin form: the Host header.
        let mut headers = HeaderMap::new();
        headers.insert(http::header::HOST, "api.example:9000".parse().unwrap());
        let origin = AuthorityKey::of(&"/x".parse().unwrap(), &headers).unwrap();
        assert_eq!(origin.as_str(), "://api.example:9000");
        assert_eq!(key("http://example.com:/"), key("http://example.com/"));
        assert_eq!(origin.port(), "9000");
        assert_eq!(
            key("HTTPS://User@Example.COM/").unwrap().as_str(),
            "https://example.com:443"
        );
        assert_eq!(
            key("http://[::1]:8080/").unwrap().as_str(),
            "http://[::1]:8080"
        );
        let long = format!("http://{}.example/", "a".repeat(200));
        let long = key(&long).unwrap();
        assert!(long.as_str().ends_with(".example:80") && long.as_str().len() > INLINE);
        headers.insert(http::header::HOST, "not an authority".parse().unwrap());
        assert!(AuthorityKey::of(&"/x".parse().unwrap(), &headers).is_none());
    }
}
