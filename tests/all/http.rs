//! The `http` provider against a real HTTP server on loopback.
