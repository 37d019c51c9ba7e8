#![cfg(feature = "opentelemetry")]
