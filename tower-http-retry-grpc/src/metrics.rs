// gRPC's retry metrics (grpc/proposal A96) through OpenTelemetry's metrics API, recorded
// by the status layer from the retry layer's record of each call (`RetryInfo`): in the
// response's extensions, or in the error. Without the `opentelemetry` feature, `Call` is
// nothing and its methods do nothing.

#[cfg(feature = "opentelemetry")]
pub(crate) use imp::{A96, Call};

#[cfg(not(feature = "opentelemetry"))]
pub(crate) use off::Call;

#[cfg(feature = "opentelemetry")]
mod imp {
    use std::error::Error as StdError;
    use std::fmt;
    use std::sync::Arc;

    use opentelemetry::KeyValue;
    use opentelemetry::metrics::{Histogram, Meter};
    use tower_http_retry::{AttemptKind, AttemptOutcome, RetryError, RetryInfo};

    // The instruments as A96 names them, with the descriptions grpc-java gives them.
    const RETRIES: &str = "grpc.client.call.retries";
    const TRANSPARENT_RETRIES: &str = "grpc.client.call.transparent_retries";
    const HEDGES: &str = "grpc.client.call.hedges";
    const RETRY_DELAY: &str = "grpc.client.call.retry_delay";

    /// A96's boundaries for the retries and the hedges.
    const COUNT_BUCKETS: [f64; 5] = [1.0, 2.0, 3.0, 4.0, 5.0];
    /// A96's boundaries for the transparent retries.
    const TRANSPARENT_BUCKETS: [f64; 6] = [1.0, 2.0, 3.0, 4.0, 5.0, 10.0];
    /// A66's latency boundaries (seconds), which A96 gives the retry delay.
    const LATENCY_BUCKETS: [f64; 41] = [
        0.0, 0.00001, 0.00005, 0.0001, 0.0003, 0.0006, 0.0008, 0.001, 0.002, 0.003, 0.004, 0.005,
        0.006, 0.008, 0.01, 0.013, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1, 0.13,
        0.16, 0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0,
    ];

    /// The four instruments and the channel's target, made once by
    /// [`StatusLayer::otel_meter`](crate::StatusLayer::otel_meter).
    pub(crate) struct A96 {
        retries: Histogram<u64>,
        transparent: Histogram<u64>,
        hedges: Histogram<u64>,
        delay: Histogram<f64>,
        target: opentelemetry::StringValue,
    }

    impl fmt::Debug for A96 {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("A96").field("target", &self.target).finish()
        }
    }

    impl A96 {
        pub(crate) fn new(meter: &Meter, target: &str) -> Self {
            let count = |name, unit, description, buckets: &[f64]| {
                meter
                    .u64_histogram(name)
                    .with_unit(unit)
                    .with_description(description)
                    .with_boundaries(buckets.to_vec())
                    .build()
            };
            Self {
                retries: count(
                    RETRIES,
                    "{retry}",
                    "Number of retries during the client call. If there were no retries, 0 \
                     is not reported.",
                    &COUNT_BUCKETS,
                ),
                transparent: count(
                    TRANSPARENT_RETRIES,
                    "{transparent_retry}",
                    "Number of transparent retries during the client call. If there were no \
                     transparent retries, 0 is not reported.",
                    &TRANSPARENT_BUCKETS,
                ),
                hedges: count(
                    HEDGES,
                    "{hedge}",
                    "Number of hedges during the client call. If there were no hedges, 0 is \
                     not reported.",
                    &COUNT_BUCKETS,
                ),
                delay: meter
                    .f64_histogram(RETRY_DELAY)
                    .with_unit("s")
                    .with_description(
                        "Total time of delay while there is no active attempt during the \
                         client call",
                    )
                    .with_boundaries(LATENCY_BUCKETS.to_vec())
                    .build(),
                target: canonical_target(target).into(),
            }
        }

        /// Records the call to `path`, as `info` tells it: each count unless 0, and the
        /// delay when the call had a retry or a hedge.
        fn record(&self, path: &str, info: &RetryInfo) {
            let (mut retries, mut transparent, mut hedges) = (0, 0, 0);
            for retry in info.retries() {
                if retry.outcome == AttemptOutcome::NotSent {
                    continue;
                }
                match retry.kind {
                    AttemptKind::Transparent => transparent += 1,
                    AttemptKind::Hedge => hedges += 1,
                    _ => retries += 1,
                }
            }
            if retries + transparent + hedges == 0 {
                return;
            }
            let attributes = [
                KeyValue::new("grpc.method", method(path)),
                KeyValue::new("grpc.target", self.target.clone()),
            ];
            for (histogram, count) in [
                (&self.retries, retries),
                (&self.transparent, transparent),
                (&self.hedges, hedges),
            ] {
                if count > 0 {
                    histogram.record(count, &attributes);
                }
            }
            if retries + hedges > 0 {
                self.delay
                    .record(info.retry_delay().as_secs_f64(), &attributes);
            }
        }
    }

    /// The target as gRPC canonicalizes a channel's: one with a resolver's scheme as it is;
    /// an `http` or `https` URI (what tonic's `Endpoint` takes) as `dns:///` and its
    /// authority, which is how tonic resolves it; anything else (`host:port`) `dns:///`
    /// and the target.
    pub(crate) fn canonical_target(target: &str) -> String {
        const SCHEMES: [&str; 8] = [
            "dns:",
            "unix:",
            "unix-abstract:",
            "ipv4:",
            "ipv6:",
            "xds:",
            "passthrough:",
            "google-c2p:",
        ];
        if SCHEMES.iter().any(|scheme| target.starts_with(scheme)) {
            return target.to_owned();
        }
        for scheme in ["http://", "https://"] {
            if let Some(rest) = target.strip_prefix(scheme) {
                let authority = rest.split(['/', '?']).next().unwrap_or_default();
                return format!("dns:///{authority}");
            }
        }
        format!("dns:///{target}")
    }

    /// `grpc.method`: the full method name, the path without its leading slash
    /// (`package.Service/Method`); a path not of that shape is `other`, as A66 records a
    /// method it does not know.
    pub(crate) fn method(path: &str) -> String {
        let name = path.strip_prefix('/').unwrap_or(path);
        match name.split_once('/') {
            Some((service, method))
                if !service.is_empty() && !method.is_empty() && !method.contains('/') =>
            {
                name.to_owned()
            }
            _ => "other".to_owned(),
        }
    }

    /// One call's part: the instruments and its path, when the layer records.
    #[derive(Debug)]
    pub(crate) struct Call(Option<(Arc<A96>, Option<http::Uri>)>);

    impl Call {
        /// A call of `request`, whose path is read if it is tonic's request (the method is
        /// `other` if not).
        pub(crate) fn start<R: 'static>(a96: Option<&Arc<A96>>, request: &R) -> Self {
            Call(a96.map(|a96| {
                let request = (request as &dyn std::any::Any)
                    .downcast_ref::<http::Request<tonic::body::Body>>();
                (Arc::clone(a96), request.map(|r| r.uri().clone()))
            }))
        }

        /// The call's end: the record in the response, or in the error.
        pub(crate) fn finish<B, E>(&self, result: &Result<http::Response<B>, E>)
        where
            E: AsRef<dyn StdError + Send + Sync>,
        {
            let Some((a96, uri)) = &self.0 else {
                return;
            };
            let info = match result {
                Ok(response) => response.extensions().get::<RetryInfo>(),
                Err(error) => record_in(error.as_ref()),
            };
            if let Some(info) = info {
                a96.record(uri.as_ref().map_or("", |uri| uri.path()), info);
            }
        }
    }

    /// The retry layer's record in an error, wherever it is in its chain.
    fn record_in<'a>(error: &'a (dyn StdError + Send + Sync + 'static)) -> Option<&'a RetryInfo> {
        let mut link: Option<&'a (dyn StdError + 'static)> = Some(error);
        while let Some(error) = link {
            if let Some(retry) = error.downcast_ref::<RetryError>() {
                return Some(retry.info());
            }
            link = error.source();
        }
        None
    }
}

#[cfg(not(feature = "opentelemetry"))]
mod off {
    /// Nothing: the `opentelemetry` feature is off.
    #[derive(Debug)]
    pub(crate) struct Call;

    impl Call {
        #[inline(always)]
        pub(crate) fn finish<B, E>(&self, _: &Result<http::Response<B>, E>) {}
    }
}

#[cfg(all(test, feature = "opentelemetry"))]
mod tests {
    use super::imp::{canonical_target, method};

    #[test]
    fn targets_are_canonical_as_grpc_makes_them() {
        let cases = [
            ("localhost:50051", "dns:///localhost:50051"),
            (
                "dns:///pubsub.googleapis.com:443",
                "dns:///pubsub.googleapis.com:443",
            ),
            ("xds:///helloworld-gke:8000", "xds:///helloworld-gke:8000"),
            ("unix:///tmp/grpc.sock", "unix:///tmp/grpc.sock"),
            ("http://127.0.0.1:50051", "dns:///127.0.0.1:50051"),
            ("https://api.example/", "dns:///api.example"),
            ("[::1]:50051", "dns:///[::1]:50051"),
        ];
        for (target, canonical) in cases {
            assert_eq!(canonical_target(target), canonical, "{target}");
        }
    }

    #[test]
    fn a_method_is_its_path_without_the_slash_or_other() {
        let cases = [
            ("/shop.Cart/Get", "shop.Cart/Get"),
            ("/Service/Method", "Service/Method"),
            ("/", "other"),
            ("/shop.Cart/", "other"),
            ("/a/b/c", "other"),
            ("//Get", "other"),
        ];
        for (path, name) in cases {
            assert_eq!(method(path), name, "{path}");
        }
    }
}
